"""Rendezvous checks against check-ins written by hand (what rank 0 would have read from the store)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from distdoctor.checks import rendezvous as rdzv
from distdoctor.core.config import Config
from distdoctor.world.decision import nccl_decision
from distdoctor.fakes import fake_context
from distdoctor.core.registry import SkipCheck
from distdoctor.world.store_exchange import Arrival, CheckIns


def payload(rank: int, host: str = "node-a", *, world_size: int = 4, torch: str = "2.13.0", cuda=None, nccl=None,
            env=None, device=None, node_rank=None, local_world_size=None, pid=None, master_addr="node-a") -> dict:
    return {
        "host": host,
        "pid": pid or 1000 + rank,
        "node_rank": node_rank,
        "local_world_size": local_world_size,
        "device": device,
        "snapshot": {
            "launcher": {"world_size": world_size, "master_addr": master_addr, "master_port": 29500},
            "torch": {"torch": torch, "cuda": cuda, "nccl": nccl, "backends": {"gloo": True, "nccl": nccl is not None}},
            "env": env or {},
            "backend": "nccl" if device else "gloo",
        },
    }


def world_of(payloads: dict, expected: int = 4, seen=None) -> CheckIns:
    arrivals = [Arrival(r, c, (seen or {}).get(r, 0.01 * r)) for (r, c) in payloads]
    return CheckIns(expected=expected, arrivals=arrivals, payloads=payloads, waited_s=1.0)


def run(check, checkins):
    ctx = fake_context(world=SimpleNamespace(checkins=checkins))
    return list(check(ctx) or [])


def full(n=4, **kw) -> dict:
    return {(r, 1): payload(r, **kw) for r in range(n)}


def test_a_healthy_world_has_no_findings():
    checkins = world_of(full())
    for check in (rdzv.all_ranks_checked_in, rdzv.unique_ranks, rdzv.world_agreement, rdzv.versions_agree,
                  rdzv.settings_agree, rdzv.arrival_spread):
        assert run(check, checkins) == [], check.__name__


def test_checks_skip_without_checkins():
    with pytest.raises(SkipCheck):
        list(rdzv.unique_ranks(fake_context()))


def test_missing_ranks_are_named_with_the_host_the_layout_predicts():
    payloads = {(r, 1): payload(r, "node-a" if r < 2 else "node-b", local_world_size=2) for r in (0, 1, 2)}
    (finding,) = run(rdzv.all_ranks_checked_in, world_of(payloads))
    assert finding.id == "rdzv.C004" and finding.ranks == (3,) and finding.hosts == ("node-b",)
    assert "rank 3" in finding.title and finding.data["expected_hosts"] == {"3": "node-b"}


def test_no_host_guess_when_the_layout_does_not_fit():
    payloads = {(0, 1): payload(0, "a", local_world_size=2), (1, 1): payload(1, "b", local_world_size=2)}
    (finding,) = run(rdzv.all_ranks_checked_in, world_of(payloads, expected=3))
    assert finding.hosts == ()


def test_collision_names_both_pids_and_hosts():
    payloads = full(2, world_size=2)
    payloads[(1, 2)] = payload(1, "node-c", world_size=2, pid=4242)
    (finding,) = run(rdzv.unique_ranks, world_of(payloads, expected=2))
    assert finding.id == "rdzv.C005" and finding.cause == "rank_config_error"
    assert finding.data["pids"] == [1001, 4242] and set(finding.hosts) == {"node-a", "node-c"}


def test_ranks_outside_the_world_and_node_rank_collisions():
    payloads = {(0, 1): payload(0, "a", node_rank=0), (1, 1): payload(1, "b", node_rank=0), (5, 1): payload(5, "c")}
    found = {f.id: f for f in run(rdzv.unique_ranks, world_of(payloads, expected=2))}
    assert found["rdzv.C007"].ranks == (5,) and found["rdzv.C007"].cause == "world_size_mismatch"
    assert found["rdzv.E008"].hosts == ("a", "b")


def test_world_size_and_master_disagreements():
    payloads = full(2, world_size=2)
    payloads[(1, 1)] = payload(1, "node-b", world_size=3, master_addr="10.0.0.1")
    found = {f.id: f for f in run(rdzv.world_agreement, world_of(payloads, expected=2))}
    assert found["rdzv.C006"].ranks == (1,) and "3 on rank 1 (node-b)" in found["rdzv.C006"].title
    assert found["rdzv.W009"].ranks == (1,) and "MASTER_ADDR" in found["rdzv.W009"].title


def test_versions_that_differ_name_the_odd_ranks():
    payloads = full(4, cuda="12.4", nccl="2.21.5")
    payloads[(3, 1)] = payload(3, "node-b", cuda="12.1", nccl="2.18.1")
    found = run(rdzv.versions_agree, world_of(payloads))
    assert {f.data["component"] for f in found} == {"cuda", "nccl"}
    assert all(f.id == "rdzv.E010" and f.ranks == (3,) and f.hosts == ("node-b",) for f in found)


def test_settings_that_differ_interface_vs_other():
    payloads = full(2, env={"NCCL_DEBUG": "INFO"})
    payloads[(1, 1)] = payload(1, env={"NCCL_SOCKET_IFNAME": "eth1", "NCCL_DEBUG": "WARN"})
    found = {f.id: f for f in run(rdzv.settings_agree, world_of(payloads, expected=2))}
    assert found["rdzv.W011"].cause == "wrong_interface" and "unset on rank 0" in found["rdzv.W011"].title
    assert found["rdzv.W012"].data["variable"] == "NCCL_DEBUG"


def test_duplicate_gpu_by_uuid_fake():
    gpu = {"index": 0, "uuid": "GPU-aaaa", "name": "H100", "how": "the only GPU this rank sees"}
    payloads = {(0, 1): payload(0, device=gpu), (1, 1): payload(1, device=dict(gpu)),
                (2, 1): payload(2, device={**gpu, "uuid": "GPU-bbbb"})}
    (finding,) = run(rdzv.gpu_mapping, world_of(payloads, expected=3))
    assert finding.id == "rdzv.E013" and finding.cause == "duplicate_gpu" and finding.ranks == (0, 1)


def test_gpu_mapping_skips_without_gpus():
    with pytest.raises(SkipCheck):
        run(rdzv.gpu_mapping, world_of(full()))


def test_gloo_ranks_sharing_the_only_gpu_are_not_duplicates():
    gpu = {"index": 0, "uuid": "GPU-aaaa", "name": "H100", "how": "the only GPU this rank sees"}
    payloads = {(r, 1): payload(r, device=dict(gpu)) for r in range(2)}
    for p in payloads.values():
        p["snapshot"]["backend"] = "gloo"
    with pytest.raises(SkipCheck):
        run(rdzv.gpu_mapping, world_of(payloads, expected=2))


def test_a_late_rank_is_a_straggler():
    seen = {0: 0.1, 1: 0.2, 2: 0.3, 3: 9.0}
    (finding,) = run(rdzv.arrival_spread, world_of(full(), seen=seen))
    assert finding.id == "rdzv.W014" and finding.ranks == (3,)


def test_nccl_runs_only_when_every_rank_has_a_gpu_and_nccl():
    gpu = lambda i: {"index": i, "uuid": f"GPU-{i}", "name": "H100", "how": "x"}  # noqa: E731
    good = {(r, 1): payload(r, nccl="2.21.5", device=gpu(r)) for r in range(2)}
    decision = nccl_decision(world_of(good, expected=2), Config())
    assert decision == {"nccl": True, "devices": {"0": 0, "1": 1}}
    one_without = dict(good)
    one_without[(1, 1)] = payload(1, nccl="2.21.5", device=None)
    decision = nccl_decision(world_of(one_without, expected=2), Config())
    assert decision == {"nccl": False, "nccl_reason": "skipped: rank 1 has no GPU"}
    assert nccl_decision(world_of(good, expected=2), Config(backend="gloo"))["nccl"] is False
