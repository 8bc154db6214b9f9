"""API keys with quotas: the key file's syntax (names, hashed keys, per-key and default limits, errors
naming the line), and the limits themselves (open sessions, session length, blocks per hour)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferix.errors import UserError
from scheduler.auth import ApiKeys, Unauthenticated, key_digest
from scheduler.quotas import HOUR_S, Quota, QuotaExceeded, Quotas

ALICE, BOB, CAROL = "key-a-0123456789abcdef", "key-b-0123456789abcdef", "key-c-0123456789abcdef"


def load(tmp_path: Path, text: str) -> ApiKeys:
    path = tmp_path / "api-keys"
    path.write_text(text)
    return ApiKeys.load(path, env="")


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


def test_keys_may_be_stored_as_sha256_digests_and_carry_quotas(tmp_path: Path) -> None:
    keys = load(
        tmp_path,
        f"{ALICE} alice sessions=2 blocks_per_hour=50  # a comment\n"
        f"sha256:{key_digest(BOB).hex()} bob blocks_per_session=30\n"
        "* sessions=5 blocks_per_session=100\n"
        f"{CAROL}\n",
    )
    assert [keys.principal(bearer(k)) for k in (ALICE, BOB, CAROL)] == ["alice", "bob", "key4"]
    assert keys.quotas.of("alice") == Quota(sessions=2, blocks_per_session=100, blocks_per_hour=50, streams=32)
    assert keys.quotas.of("bob") == Quota(sessions=5, blocks_per_session=30, blocks_per_hour=0)
    assert keys.quotas.of("key4") == Quota(sessions=5, blocks_per_session=100, blocks_per_hour=0)
    assert ALICE.encode() not in repr(keys).encode()  # only digests are kept
    with pytest.raises(Unauthenticated, match="unknown API key"):
        keys.principal(bearer(key_digest(BOB).hex()))  # the digest itself is not a key


def test_without_a_star_line_keys_get_the_default_quota_and_an_open_server_none(tmp_path: Path) -> None:
    assert load(tmp_path, f"{ALICE} alice\n").quotas.of("alice") == Quota()
    open_server = ApiKeys.load(None, env="")
    assert not open_server.enabled
    open_server.quotas.check_create("anonymous", open_sessions=1000, num_blocks=None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"{ALICE} alice sessions=two\n", "api-keys:1: sessions must be a whole number >= 0 (0: unlimited), got 'two'"),
        (f"{ALICE} alice viewers=2\n", "api-keys:1: unknown quota 'viewers' (quotas: sessions, blocks_per_session"),
        ("sha256:abc alice\n", "api-keys:1: a hashed key is sha256: and 64 lowercase hex digits"),
        ("short alice\n", "api-keys:1: API keys must be at least 16 characters"),
        (f"{ALICE} alice\n* blocks_per_hour=-1\n", "api-keys:2: blocks_per_hour must be a whole number"),
    ],
)
def test_a_bad_key_file_names_the_line_and_the_setting(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(tmp_path, text)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_limits_name_themselves_and_the_hourly_budget_refills() -> None:
    clock = Clock()
    quotas = Quotas({"alice": Quota(sessions=2, blocks_per_session=10, blocks_per_hour=3)}, Quota(), clock)
    quotas.check_create("alice", open_sessions=1, num_blocks=10)
    with pytest.raises(QuotaExceeded, match=r"key 'alice' has 2 open sessions \(limit sessions=2\)"):
        quotas.check_create("alice", open_sessions=2, num_blocks=5)
    with pytest.raises(QuotaExceeded, match=r"num_blocks: 11 is above the limit blocks_per_session=10 of key 'alice'"):
        quotas.check_create("alice", open_sessions=0, num_blocks=11)
    with pytest.raises(QuotaExceeded, match=r"num_blocks: 0 \(unbounded\) is above"):
        quotas.check_create("alice", open_sessions=0, num_blocks=None)
    for _ in range(3):
        assert quotas.wait_s("alice") == 0
        quotas.charge_block("alice")
        clock.now += 10
    assert quotas.wait_s("alice") == pytest.approx(HOUR_S - 30)
    with pytest.raises(QuotaExceeded, match=r"made 3 blocks in the last hour \(limit blocks_per_hour=3\)"):
        quotas.check_create("alice", open_sessions=0, num_blocks=1)
    assert quotas.wait_s("bob") == 0  # other keys are not affected
    clock.now += HOUR_S - 29  # the first block leaves the hour
    assert quotas.wait_s("alice") == 0
