"""Placement policy: pure functions, no service."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcache_svc.errors import NoCapacityError, NotFoundError
from kvcache_svc.placement import PlacementRequest, WorkerLoad, choose_worker, fits


def worker(
    worker_id: str, total: int, used: int = 0, reserved: int = 0, alive: bool = True, model: str = "m"
) -> WorkerLoad:
    return WorkerLoad(worker_id, model, total, used, reserved, alive)


def request(pages: int, model: str = "m", exclude: tuple[str, ...] = ()) -> PlacementRequest:
    return PlacementRequest("s", model, pages, frozenset(exclude))


def test_free_pages_count_the_larger_of_use_and_reservations() -> None:
    assert worker("a", 10, used=3, reserved=5).free_pages == 5
    assert worker("a", 10, used=7, reserved=5).free_pages == 3
    assert worker("a", 10, used=0, reserved=12).free_pages == 0  # a shrunken pool never goes negative


def test_most_free_pages_wins_and_ties_go_to_the_lowest_id() -> None:
    workers = [worker("b", 16, reserved=4), worker("c", 16, used=8), worker("a", 8)]
    assert choose_worker(workers, request(4)).worker_id == "b"
    tied = [worker("z", 8), worker("m2", 8), worker("m1", 8)]
    assert choose_worker(tied, request(8)).worker_id == "m1"


def test_dead_excluded_and_other_model_workers_are_never_chosen() -> None:
    workers = [
        worker("dead", 100, alive=False),
        worker("excluded", 90),
        worker("other", 80, model="x"),
        worker("small", 4),
    ]
    assert choose_worker(workers, request(4, exclude=("excluded",))).worker_id == "small"
    with pytest.raises(NoCapacityError) as info:
        choose_worker(workers, request(5, exclude=("excluded",)))
    message = str(info.value)
    for fragment in ("needs 5 pages", "is 4", "dead: unavailable", "excluded: excluded", "small: 4 free of 4"):
        assert fragment in message
    assert "other" not in message  # workers of other models are irrelevant to this request


def test_unknown_model_lists_the_served_models() -> None:
    with pytest.raises(NotFoundError, match="no worker serves model 'magi'; served models: 'a', 'b'"):
        choose_worker([worker("1", 8, model="b"), worker("2", 8, model="a")], request(1, model="magi"))
    with pytest.raises(NotFoundError, match="no worker has registered"):
        choose_worker([], request(1))


@settings(max_examples=200, deadline=None)
@given(
    capacities=st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=6),
    demands=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=40),
)
def test_admitting_in_sequence_never_overcommits(capacities: list[int], demands: list[int]) -> None:
    """Admit every demand in turn: a worker's reservations never exceed its capacity, and a
    request is refused only when it fits nowhere."""
    loads = {f"w{i}": worker(f"w{i}", total) for i, total in enumerate(capacities)}
    for pages in demands:
        try:
            chosen = choose_worker(loads.values(), request(pages))
        except NoCapacityError:
            assert all(not fits(w, request(pages)) for w in loads.values())
            continue
        assert chosen.free_pages == max(w.free_pages for w in loads.values())
        loads[chosen.worker_id] = worker(chosen.worker_id, chosen.total_pages, reserved=chosen.reserved_pages + pages)
        assert all(w.reserved_pages <= w.total_pages for w in loads.values())
