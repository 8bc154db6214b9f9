"""Placement policy: pure functions, no service."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferix.spec.capacity import Resolution, StreamCapacity
from kvcache_svc.errors import NoCapacityError, NotFoundError
from kvcache_svc.placement import (
    PlacementRequest,
    WorkerLoad,
    choose_worker,
    fits,
    request_cost,
    stream_cost,
)

R64, R128 = Resolution(64, 64), Resolution(128, 128)


def worker(
    worker_id: str,
    total: int,
    used: int = 0,
    reserved: int = 0,
    alive: bool = True,
    model: str = "m",
    capacity: tuple[StreamCapacity, ...] = (),
    load: float = 0.0,
) -> WorkerLoad:
    return WorkerLoad(worker_id, model, total, used, reserved, alive, capacity, load)


def request(
    pages: int, model: str = "m", exclude: tuple[str, ...] = (), resolution: Resolution | None = None
) -> PlacementRequest:
    return PlacementRequest("s", model, pages, frozenset(exclude), resolution)


def streams(resolution: Resolution, count: int, block_ms: float = 180.0, budget_ms: float = 187.5) -> StreamCapacity:
    return StreamCapacity(resolution, count, block_ms, budget_ms, measured_up_to=8)


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
    fragments = ("5 KV pages", "dead: unavailable", "excluded: excluded", "small: 4 free of 4 pages", "fewer pages")
    for fragment in fragments:
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


def test_stream_cost_follows_the_measured_capacity() -> None:
    capacity = (streams(R64, 6), streams(Resolution(32, 32), 0))
    assert stream_cost(capacity, R64) == pytest.approx(1 / 6)  # measured: one of its 6 streams
    assert stream_cost(capacity, Resolution(32, 32)) == 1.0  # not even one stream: the worker to itself
    # Not measured: scaled by pixels from the measured entry with the most pixels (64x64, 6 streams).
    assert stream_cost(capacity, Resolution(64, 32)) == pytest.approx(0.5 / 6)
    assert stream_cost(capacity, Resolution(96, 96)) == pytest.approx(2.25 / 6)
    assert stream_cost(capacity, Resolution(256, 256)) == 1.0  # 16 / 6, capped at the whole worker
    assert stream_cost((streams(R128, 0),), R64) == pytest.approx(0.25)  # a reference of 0 streams counts as 1
    assert stream_cost((), R64) == 0.0  # nothing measured: admission by pages only
    assert stream_cost(capacity, None) == 0.0  # no resolution in the request: pages only
    assert stream_cost(capacity, Resolution(0, 0)) == 0.0


def test_a_worker_fits_while_its_stream_load_leaves_room() -> None:
    capacity = (streams(R64, 4),)
    assert fits(worker("a", 16, capacity=capacity, load=0.75), request(1, resolution=R64))
    assert not fits(worker("a", 16, capacity=capacity, load=0.76), request(1, resolution=R64))
    # Float sums of exact shares fill a worker exactly: six sixths, or three thirds and one half.
    assert fits(worker("a", 16, capacity=(streams(R64, 6),), load=sum([1 / 6] * 5)), request(1, resolution=R64))
    assert fits(worker("a", 16, capacity=(streams(R64, 0),)), request(1, resolution=R64))
    assert not fits(worker("a", 16, capacity=(streams(R64, 0),), load=0.01), request(1, resolution=R64))
    # A cost of 0 always fits on streams (an unmeasured worker, or no resolution); pages still count.
    assert fits(worker("a", 16, load=3.0), request(16, resolution=R64))
    assert fits(worker("a", 16, capacity=capacity, load=1.0), request(16))
    assert not fits(worker("a", 16, capacity=capacity), request(17, resolution=R64))


def test_lower_stream_load_wins_before_free_pages() -> None:
    capacity = (streams(R64, 4),)
    busy = worker("a", 64, capacity=capacity, load=0.5)  # the most free pages, but half its streams in use
    idle = worker("b", 8, capacity=capacity)
    assert choose_worker([busy, idle], request(4, resolution=R64)).worker_id == "b"
    # Load after admission decides: 1 of 8 streams on "c" (0.25 + 0.125) beats 1 of 2 on "d" (0 + 0.5).
    small = worker("c", 8, capacity=(streams(R64, 8),), load=0.25)
    large = worker("d", 64, capacity=(streams(R64, 2),))
    assert choose_worker([small, large], request(4, resolution=R64)).worker_id == "c"
    # Equal loads fall back to the most free pages, then the lowest id.
    assert choose_worker([worker("e", 8, capacity=capacity), idle], request(4, resolution=R64)).worker_id == "b"
    assert choose_worker([worker("a0", 8, capacity=capacity), idle], request(4, resolution=R64)).worker_id == "a0"


def test_a_worker_at_its_stream_capacity_refuses_with_the_numbers() -> None:
    full = worker("w0", 200, reserved=54, capacity=(streams(R64, 6, block_ms=180.4, budget_ms=187.5),), load=1.0)
    alone = worker("w1", 8, capacity=(streams(R64, 0, block_ms=250.0),), load=1.0)
    estimated = worker("w2", 64, capacity=(streams(R128, 2, block_ms=150.0),), load=0.95)
    with pytest.raises(NoCapacityError) as info:
        choose_worker([full, alone, estimated], PlacementRequest("x", "m", 9, resolution=R64))
    message, reason = str(info.value), info.value.reason
    assert reason == "realtime"
    assert message.startswith("no worker has room for session 'x' (model 'm' at 64x64, 9 KV pages): ")
    assert (
        "w0: 6 of 6 real-time streams at 64x64 in use (block 180 ms at 6 streams, budget 188 ms), "
        "146 free of 200 pages" in message
    )
    assert (
        "w1: not one real-time stream at 64x64 (block 250 ms at 1 stream, budget 188 ms), so a session there takes "
        "the whole worker, 100% of it in use, 8 free of 8 pages" in message
    )
    assert (
        "w2: 95% of its real-time streams in use, a stream at 64x64 (not measured) taking an estimated 12%, "
        "scaled by pixels from 2 real-time streams at 128x128 (block 150 ms at 2 streams, budget 188 ms)" in message
    )
    assert message.endswith(
        "; retry later, ask for fewer pages (a smaller window) or a lower resolution, or add workers"
    )

    # Mixed resolutions take shares of one capacity: 2 sessions at 128x128 (1/4 each), 3 at 64x64 (1/8 each).
    mixed = worker("w3", 64, capacity=(streams(R64, 8), streams(R128, 4)), load=2 / 4 + 3 / 8)
    with pytest.raises(NoCapacityError, match=r"w3: 3.5 of 4 real-time streams at 128x128 in use"):
        choose_worker([mixed], PlacementRequest("y", "m", 1, resolution=R128))
    assert choose_worker([mixed], PlacementRequest("y", "m", 1, resolution=R64)).worker_id == "w3"  # 7 of 8 in use


def test_refusals_name_their_reason() -> None:
    capacity = (streams(R64, 2),)
    with pytest.raises(NoCapacityError) as info:
        choose_worker([worker("a", 4, capacity=capacity)], request(5, resolution=R64))
    assert info.value.reason == "pages"
    assert "a: 0 of 2 real-time streams at 64x64 in use" in str(info.value)  # stated, though not the limit
    assert str(info.value).endswith("retry later, ask for fewer pages (a smaller window), or add workers")
    with pytest.raises(NoCapacityError) as info:
        choose_worker([worker("a", 4, alive=False)], request(1))
    assert info.value.reason == "unavailable" and str(info.value).endswith("a: unavailable; retry later or add workers")


@settings(max_examples=200, deadline=None)
@given(
    measured=st.lists(
        st.lists(st.tuples(st.sampled_from([32, 64, 128]), st.integers(min_value=0, max_value=6)), max_size=3),
        min_size=1,
        max_size=4,
    ),
    sessions=st.lists(st.sampled_from([None, 32, 64, 96, 128]), min_size=1, max_size=30),
)
def test_admitting_in_sequence_never_overcommits_streams(
    measured: list[list[tuple[int, int]]], sessions: list[int | None]
) -> None:
    """Sessions of mixed resolutions: a worker's stream load never exceeds 1, and a session is
    refused only when it fits nowhere."""
    loads = {}
    for i, entries in enumerate(measured):
        capacity = {Resolution(side, side): streams(Resolution(side, side), count) for side, count in entries}
        loads[f"w{i}"] = worker(f"w{i}", 1000, capacity=tuple(capacity.values()))
    for side in sessions:
        wanted = request(1, resolution=None if side is None else Resolution(side, side))
        try:
            chosen = choose_worker(loads.values(), wanted)
        except NoCapacityError:
            assert all(not fits(w, wanted) for w in loads.values())
            continue
        cost = request_cost(chosen, wanted)
        loads[chosen.worker_id] = worker(
            chosen.worker_id, 1000, capacity=chosen.capacity, load=chosen.stream_load + cost
        )
        assert all(w.stream_load <= 1 + 1e-9 for w in loads.values())
