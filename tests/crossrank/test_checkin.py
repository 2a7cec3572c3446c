"""The check-in protocol against torch's in-process HashStore: what a foreign writer can put there."""

from __future__ import annotations

import json
import time

import pytest

from distdoctor.world.checkin import VERDICT, CheckInProtocol, Prefixed, parse_roster

torch_dist = pytest.importorskip("torch.distributed")


def protocol(store=None, size: int = 2):
    store = store if store is not None else torch_dist.HashStore()
    return store, CheckInProtocol(Prefixed(store, "t/"), size=size)


def soon(seconds: float = 0.3) -> float:
    return time.monotonic() + seconds


def test_two_ranks_check_in_and_rank_0_sees_both():
    store, p0 = protocol()
    _, p1 = protocol(store)
    assert p0.check_in(0, {"pid": 1}, soon()) == (1, False)
    assert p1.check_in(1, {"pid": 2}, soon()) == (1, False)
    seen, _ = p0.wait_roster(2, soon(1.0))
    assert set(seen) == {(0, 1), (1, 1)} and not p0.malformed


@pytest.mark.parametrize("line", ["²:1;", "9" * 5000 + ":1;", "1:0;", "x:1;", "1:" + "9" * 11 + ";"])
def test_malformed_roster_lines_are_noted_not_parsed(line):
    store, p0 = protocol()
    store.append("t/roster", line)
    p0.check_in(0, {}, soon())
    assert p0.roster(2) == [(0, 1)] and "roster" in p0.malformed


def test_a_roster_line_without_its_check_in_is_refused_at_once():
    store, p0 = protocol()
    store.append("t/roster", "1:7;")
    p0.check_in(0, {}, soon())
    start = time.monotonic()
    seen, _ = p0.wait_roster(2, soon(0.5))
    assert (1, 7) not in seen and "checkin/1/7" in p0.malformed
    assert time.monotonic() - start < 2.0


def test_a_roster_flood_cannot_push_a_real_rank_out():
    store, p0 = protocol()
    _, p1 = protocol(store)
    store.append("t/roster", "".join(f"{i}:1;" for i in range(2, 200_002)) + "".join(f"1:{c};" for c in range(2, 500)))
    p0.check_in(0, {}, soon())
    p1.check_in(1, {}, soon())  # its claim is 1: the flood's 1:2..1:499 never became claims
    seen, _ = p0.wait_roster(2, soon(2.0))
    assert {(0, 1), (1, 1)} <= set(seen) and "roster" in p0.malformed


def test_a_check_in_of_the_wrong_shape_is_unreadable_and_not_an_arrival():
    store, p0 = protocol()
    store.set("t/checkin/1/1", json.dumps({"findings": 5}))
    store.append("t/roster", "1:1;")
    p0.check_in(0, {}, soon())
    seen, _ = p0.wait_roster(2, soon(0.3))
    payloads, unreadable = p0.read_checkins(p0.roster(2))
    assert (1, 1) not in seen and (1, 1) in unreadable and "findings" in unreadable[(1, 1)]


def test_a_bumped_claim_counter_does_not_make_a_duplicate(monkeypatch):
    monkeypatch.setattr("distdoctor.world.checkin.CLAIM_GRACE_S", 0.2)
    store, p0 = protocol()
    store.add("t/claim/0", 1)
    claim, duplicate = p0.check_in(0, {}, soon(1.0))
    assert (claim, duplicate) == (2, False) and "claim/0" in p0.malformed


def test_a_real_second_claimant_is_a_duplicate():
    store, first = protocol()
    _, second = protocol(store)
    first.check_in(1, {}, soon())
    assert second.check_in(1, {}, soon()) == (2, True)


def test_a_counter_that_is_not_a_number_is_never_added_to():
    store, p0 = protocol()
    store.set("t/claim/1", "abc")
    claim, duplicate = p0.check_in(1, {}, soon())
    assert not duplicate and claim == 1 and "claim/1" in p0.malformed
    assert store.get("t/claim/1") == b"abc"  # untouched: an add would have raised in the store


def test_a_malformed_decision_is_replaced_and_waited_past():
    store, p0 = protocol()
    _, p1 = protocol(store)
    store.set("t/decision", json.dumps({"ok": "yes"}))
    assert p1.wait_for({"decision": VERDICT}, soon(0.2)) == (None, None)
    assert p0.decide({"ok": True}, *VERDICT) == {"ok": True}
    assert p1.wait_for({"decision": VERDICT}, soon(0.5)) == ("decision", {"ok": True})
    assert "decision" in p1.malformed and "decision" in p0.malformed


def test_the_first_valid_decision_holds():
    store, p0 = protocol()
    _, p1 = protocol(store)
    abort = {"ok": False, "findings": []}
    assert p1.decide(abort, *VERDICT) == abort
    assert p0.decide({"ok": True}, *VERDICT) == abort


def test_marked_ranks_skip_garbage_lines():
    store, p0 = protocol()
    store.append("t/done/x", "²;1;" + "9" * 5000 + ";")
    assert p0.marked("done/x") == {1} and "done/x" in p0.malformed


def test_parse_roster_is_ascii_only():
    assert parse_roster("0:1;1:1;1:2;junk;2:;²:1;") == [(0, 1), (1, 1), (1, 2)]
