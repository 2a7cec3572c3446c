"""The store exchange of distdoctor.world.store_exchange against torch's in-process HashStore (no sockets)."""

from __future__ import annotations

import time

import pytest

from distdoctor.machine.launchers import detect
from distdoctor.world.checkin import parse_roster
from distdoctor.world.store_exchange import CheckIns, World, WorldError, decode, encode, fit
from distdoctor.world.store_open import WorldSpec
from tests.conftest import measured_startup_s

torch_dist = pytest.importorskip("torch.distributed")


def spec(rank: int, size: int = 2) -> WorldSpec:
    return WorldSpec(rank=rank, world_size=size, master_addr="127.0.0.1", master_port=29500,
                     store_host="rank0", namespace="distdoctor/test", launcher="manual")


def worlds(size: int, ranks=None):
    store = torch_dist.HashStore()
    return store, [World(spec(r, size), store) for r in (ranks if ranks is not None else range(size))]


def test_world_spec_uses_the_agent_store_under_torchrun():
    env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node-a", "MASTER_PORT": "29400",
           "TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_USE_AGENT_STORE": "True",
           "GROUP_RANK": "0", "ROLE_RANK": "1"}
    s = WorldSpec.from_launch(detect(env), env)
    assert s.store_host == "agent" and s.namespace == "distdoctor/job7/2" and s.rank == 1 and s.world_size == 4
    by_hand = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"}
    assert WorldSpec.from_launch(detect(by_hand), by_hand).store_host == "rank0"
    assert WorldSpec.from_launch(detect({"RANK": "0"}), {"RANK": "0"}) is None


def test_messages_are_bounded_json():
    assert decode(encode({"a": [1, 2]})) == {"a": [1, 2]}
    with pytest.raises(WorldError):
        encode({"x": "y" * 100}, limit=50)
    with pytest.raises(WorldError):
        decode(b"\x80not json")
    with pytest.raises(WorldError):
        decode(b"1" * 100, limit=10)
    slim = fit({"keep": 1, "big": "z" * 500, "also": "w" * 500}, limit=300, droppable=("big", "also"))
    assert slim["keep"] == 1 and slim["big"] is None and slim["truncated"] == ["big", "also"]


def test_roster_parsing_ignores_garbage():
    assert parse_roster("0:1;1:1;1:2;junk;2:;") == [(0, 1), (1, 1), (1, 2)]


def test_check_in_detects_a_second_claimant_and_keeps_both_payloads():
    store, (rank0, rank1a, rank1b) = worlds(2, ranks=[0, 1, 1])
    assert rank0.check_in({"pid": 10, "host": "a"}) == 1
    assert rank1a.check_in({"pid": 11, "host": "b"}) == 1
    assert rank1b.check_in({"pid": 12, "host": "c"}) == 2
    assert rank1b.is_duplicate and not rank1a.is_duplicate
    checkins = rank0.wait_for_checkins(time.monotonic() + 1.0)
    assert checkins.missing == [] and checkins.duplicates == {1: [1, 2]}
    assert checkins.payloads[(1, 2)]["pid"] == 12 and checkins.accepted[1]["pid"] == 11


def test_wait_for_checkins_names_missing_ranks_at_the_deadline():
    store, (rank0, rank1) = worlds(3, ranks=[0, 1])
    rank0.check_in({})
    rank1.check_in({})
    start = time.monotonic()
    checkins = rank0.wait_for_checkins(start + 0.3)
    assert 0.25 <= time.monotonic() - start < 1.0 + measured_startup_s()
    assert checkins.missing == [2] and checkins.reported == [0, 1]


def test_an_unreadable_checkin_is_reported_not_trusted():
    store, (rank0,) = worlds(2, ranks=[0])
    rank0.check_in({})
    prefixed = torch_dist.PrefixStore("distdoctor/test", store)
    prefixed.set("checkin/1/1", b"{not json")
    prefixed.append("roster", "1:1;")
    checkins = rank0.wait_for_checkins(time.monotonic() + 0.5)
    assert (1, 1) in checkins.unreadable and (1, 1) not in checkins.payloads


def test_stage_results_and_final_round_trip():
    store, (rank0, rank1) = worlds(2)
    rank1.mark_done("collective", {"checks": [{"name": "x"}], "incomplete": False})
    assert rank0.wait_done("collective", [1], time.monotonic() + 0.5) == {1}
    assert rank0.results("collective", [1])[1]["checks"] == [{"name": "x"}]
    assert rank0.wait_done("collective", [1, 2], time.monotonic() + 0.1) == {1}
    assert rank1.fetch("final", time.monotonic() + 0.05) is None
    rank0.put("final", {"exit": 1})
    assert rank1.fetch("final", time.monotonic() + 0.5) == {"exit": 1}


def test_checkins_properties_on_plain_data():
    from distdoctor.world.store_exchange import Arrival

    c = CheckIns(expected=3, arrivals=[Arrival(0, 1, 0.0), Arrival(2, 1, 0.1), Arrival(5, 1, 0.2)],
                 payloads={(0, 1): {}, (2, 1): {}, (5, 1): {}})
    assert c.missing == [1] and c.reported == [0, 2] and c.duplicates == {}
