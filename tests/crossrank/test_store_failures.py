"""How a failure to reach or host the store is judged, and a process group that cannot form.

The connect verdicts run against fake probes (a scripted sequence of connect outcomes and an
ARP table); hosting runs a real TCPStore on a free loopback port; the process-group signal runs
two World handles over one in-process HashStore with the group creation stood in for.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

import pytest

from distdoctor.world import store_open as world_mod
from distdoctor.world.decision import group_blockers
from distdoctor.fakes import FakeProbes, fake_context
from distdoctor.machine.probes import ConnectResult, Interface
from distdoctor.world.watchdog import Watchdog
from distdoctor.world.store_exchange import Arrival, CheckIns, GroupFailedElsewhere, World, WorldError
from distdoctor.world.store_open import WorldSpec, open_store, wait_for_listener
from tests.conftest import free_port, measured_startup_s

torch_dist = pytest.importorskip("torch.distributed")


@dataclass
class ScriptedProbes(FakeProbes):
    """connect() answers the scripted statuses in turn (the last one repeats)."""

    script: list[str] = field(default_factory=list)
    silent_after: int | None = None  # ARP goes unanswered from this attempt on (a partition)
    calls: int = 0

    def connect(self, host: str, port: int, timeout: float = 3.0) -> ConnectResult:
        status = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if self.silent_after is not None and self.calls > self.silent_after:
            self.arp_silent = frozenset({"10.0.0.9"})
        detail = {"refused": "Connection refused", "no_route": "No route to host", "timeout": "no answer within 2s"}
        return ConnectResult(host, port, status, "10.0.0.9", detail=detail.get(status, status))


class StepClock:
    """Every reading advances the time, so a polling loop reaches its deadline without sleeping long."""

    def __init__(self, step: float = 0.5) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def verdict(script, deadline=5.0, **kw):
    probes = ScriptedProbes(dns={"master": ["10.0.0.9"]}, script=list(script), **kw)
    return wait_for_listener("master", 29500, deadline, StepClock(), probes)


def test_a_listener_found_is_no_problem():
    assert verdict(["refused", "refused", "open"]) is None


def test_refused_is_master_unreachable_even_after_timeouts():
    problem = verdict(["timeout", "refused"])
    assert problem.kind == "refused" and problem.cause == "master_unreachable"
    assert "Connection refused" in problem.detail and "timeout" in problem.detail  # what else was seen


def test_timeouts_on_a_resolved_link_are_a_firewall():
    problem = verdict(["timeout"])
    assert problem.kind == "timeout" and problem.cause == "firewall"


def test_a_partition_that_later_fails_arp_stays_a_firewall():
    # The master answered ARP when this rank started (its first connects time out with the
    # neighbour entry resolved); later the entry fails too, as a full partition makes it.
    problem = verdict(["timeout", "timeout", "no_route"], silent_after=1)
    assert problem.kind == "timeout" and problem.cause == "firewall", problem


def test_nobody_answering_arp_is_master_unreachable_not_a_firewall():
    problem = verdict(["timeout"], arp_silent=frozenset({"10.0.0.9"}))
    assert problem.kind == "no_host" and problem.cause == "master_unreachable"
    assert "no host answers ARP for 10.0.0.9" in problem.detail


def test_no_route_from_the_start_is_master_unreachable():
    problem = verdict(["no_route"])
    assert problem.kind == "no_route" and problem.cause == "master_unreachable"


def rank0_spec(addr: str, port: int) -> WorldSpec:
    return WorldSpec(rank=0, world_size=2, master_addr=addr, master_port=port, store_host="rank0",
                     namespace="distdoctor/test", launcher="manual")


def test_rank_0_on_a_master_addr_of_another_host_reports_at_once_and_frees_the_port():
    port = free_port()
    probes = FakeProbes(dns={"10.231.0.99": ["10.231.0.99"]}, ports={("10.231.0.99", port): "timeout"},
                        arp_silent=frozenset({"10.231.0.99"}))
    start = time.monotonic()
    with pytest.raises(WorldError) as caught:
        open_store(rank0_spec("10.231.0.99", port), time.monotonic() + 20, probes=probes)
    assert time.monotonic() - start < min(5 + measured_startup_s(), 18)  # not the 20 s deadline
    exc = caught.value
    assert exc.reason == "master_not_here" and exc.cause == "master_unreachable", exc
    assert exc.data["probe"] == "no_host" and "not an address of this host" in str(exc)
    with socket.socket() as s:  # the store rank 0 started for the probe is gone
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))


def test_rank_0_with_a_master_addr_that_leads_here_hosts_the_store():
    # A virtual IP or NAT address: not local, but a connect to it reaches this host's store.
    port = free_port()
    probes = FakeProbes(dns={"10.96.0.10": ["10.96.0.10"]}, ports={("10.96.0.10", port): "open"})
    store, hosted, host = open_store(rank0_spec("10.96.0.10", port), time.monotonic() + 20, probes=probes)
    try:
        assert hosted and host == "127.0.0.1"
        store.set("k", "v")
        assert store.get("k") == b"v"
    finally:
        del store


def test_only_eaddrinuse_is_a_taken_port():
    holder = socket.socket()  # bound, never listening: the port is taken and nothing answers
    holder.bind(("0.0.0.0", 0))
    port = holder.getsockname()[1]
    try:
        with pytest.raises(WorldError) as caught:
            open_store(rank0_spec("127.0.0.1", port), time.monotonic() + 20)
    finally:
        holder.close()
    assert caught.value.reason == "port_taken" and caught.value.cause == "port_in_use"
    assert "EADDRINUSE" in str(caught.value)


def test_any_other_hosting_error_is_named_as_it_is(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("The server socket has failed to bind: code: -13, name: EACCES, message: permission denied")

    monkeypatch.setattr(world_mod, "_tcp_store", refuse)
    with pytest.raises(WorldError) as caught:
        open_store(rank0_spec("127.0.0.1", free_port()), time.monotonic() + 20)
    assert caught.value.reason == "host_failed" and caught.value.cause == "unknown"
    assert "EACCES" in str(caught.value)


# -- a process group that cannot form ---------------------------------------------------------
def checkins_with(findings_by_rank):
    payloads = {(r, 1): {"host": f"host{r}", "findings": f} for r, f in findings_by_rank.items()}
    return CheckIns(len(findings_by_rank), [Arrival(r, 1, 0.0) for r in findings_by_rank], payloads)


def ifname_finding(variable, data, severity="error"):
    return {"id": "net.E008", "severity": severity, "cause": "wrong_interface", "title": f"{variable}='x'",
            "data": {"variable": variable, "value": "x", **data}}


def test_a_missing_gloo_interface_blocks_the_gloo_group():
    missing = ifname_finding("GLOO_SOCKET_IFNAME", {"unusable": ["eth0"], "interfaces": ["lo", "ens5"]})
    blockers = group_blockers(checkins_with({0: [], 1: [missing]}))
    assert blockers["nccl"] == [] and len(blockers["gloo"]) == 1
    assert "rank 1 on host1" in blockers["gloo"][0] and "net.E008" in blockers["gloo"][0]


def test_what_does_not_make_the_group_fail_for_certain_blocks_nothing():
    down = ifname_finding("GLOO_SOCKET_IFNAME", {"unusable": ["eth1"], "interfaces": ["lo", "eth1"]})
    loopback = ifname_finding("GLOO_SOCKET_IFNAME", {"selected": ["lo"]})
    warning = ifname_finding("GLOO_SOCKET_IFNAME", {"unusable": ["eth0"], "interfaces": ["lo"]}, severity="warning")
    assert group_blockers(checkins_with({0: [down, loopback, warning], 1: []})) == {"gloo": [], "nccl": []}


def test_an_nccl_interface_matching_nothing_blocks_only_nccl():
    nothing = ifname_finding("NCCL_SOCKET_IFNAME", {"matched": [], "interfaces": ["lo", "eth0"]})
    blockers = group_blockers(checkins_with({0: [nothing], 1: []}))
    assert blockers["gloo"] == [] and len(blockers["nccl"]) == 1


def worlds_over_one_store(size=2):
    store = torch_dist.HashStore()
    spec = lambda r: WorldSpec(rank=r, world_size=size, master_addr="127.0.0.1", master_port=29500,
                               store_host="rank0", namespace="distdoctor/test", launcher="manual")
    return [World(spec(r), store) for r in range(size)]


def test_a_failing_rank_tells_the_others_and_they_stop_waiting_at_once(monkeypatch):
    rank0, rank1 = worlds_over_one_store()
    release = threading.Event()

    def blocked(self, backend, timeout):
        release.wait(30)  # stands for gloo's connect, waiting for a peer that never comes
        raise RuntimeError("timed out")

    def fails(self, backend, timeout):
        raise RuntimeError("[enforce fail at device.cc:84] ifa != nullptr. Unable to find address for: ddnoif0")

    outcome = {}

    def rank0_creates():
        start = time.monotonic()
        try:
            rank0.process_group("gloo", 20.0)
        except GroupFailedElsewhere as exc:
            outcome["exc"], outcome["after"] = exc, time.monotonic() - start

    monkeypatch.setattr(World, "_create_group", lambda self, b, t: (blocked if self is rank0 else fails)(self, b, t))
    waiter = threading.Thread(target=rank0_creates)
    waiter.start()
    time.sleep(0.2)
    with pytest.raises(RuntimeError, match="Unable to find address"):
        rank1.process_group("gloo", 20.0)
    waiter.join(5)
    release.set()
    assert "exc" in outcome and outcome["after"] < min(3 + measured_startup_s(), 18), outcome  # not 20 s
    assert outcome["exc"].failures == {1: "[enforce fail at device.cc:84] ifa != nullptr. Unable to find address for: ddnoif0"}
    assert rank1.group_failures("gloo") == {}  # a rank never counts its own failure


def test_gloo_finding_no_address_for_its_interface_is_wrong_interface():
    from distdoctor.checks.collective import PG_NO_INTERFACE, pg_failure

    nics = {"lo": Interface("lo", True, ("127.0.0.1",), (), True), "ens5": Interface("ens5", True, ("10.0.0.2",))}
    ctx = fake_context(env={"GLOO_SOCKET_IFNAME": "eth0"}, probes=FakeProbes(nics=nics))
    exc = RuntimeError("[enforce fail at /x/gloo/transport/tcp/device.cc:84] ifa != nullptr. Unable to find address for: eth0")
    finding = pg_failure(exc, "gloo", 0.01, 8.0, ctx)
    assert finding.id == PG_NO_INTERFACE.id and finding.cause == "wrong_interface"
    assert "eth0" in finding.title and "GLOO_SOCKET_IFNAME=ens5" in finding.remediation
    assert finding.data["interface"] == "eth0"
    other = pg_failure(RuntimeError("Connection reset by peer"), "gloo", 0.01, 8.0, ctx)
    assert other.id == "coll.C002" and other.cause == "unknown"


def test_the_watchdog_exits_with_the_code_the_run_already_reported():
    exits, done = [], threading.Event()

    def exit_(code):
        exits.append(code)
        done.set()

    Watchdog(time.monotonic() + 0.05, lambda: 1, exit=exit_, grace_s=0.5).start()
    assert done.wait(2.0)
    time.sleep(0.6)
    assert exits == [1]


def test_an_address_rank_0_cannot_assign_is_master_unreachable(monkeypatch):
    def cannot_assign(*args, **kwargs):
        raise RuntimeError("The server socket has failed to bind. code: -99, name: EADDRNOTAVAIL, "
                           "message: cannot assign requested address")

    monkeypatch.setattr(world_mod, "_tcp_store", cannot_assign)
    with pytest.raises(WorldError) as caught:
        open_store(rank0_spec("127.0.0.1", free_port()), time.monotonic() + 20)
    assert caught.value.reason == "master_not_here" and caught.value.cause == "master_unreachable"
