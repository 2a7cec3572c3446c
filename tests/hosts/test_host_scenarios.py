"""Real multi-host faults, each produced for real in network namespaces.

Every scenario runs distdoctor as one rank per host (the way a multi-node job is started by
hand) and asserts the cause, the rank or host named, and that every rank answered within the
deadline + 1 s. Each scenario's `torch` case (marked extended) runs the plain torch script
(init_process_group("gloo") with torch's defaults and one all_reduce) in the same set-up for a
short bounded time, to record what users get today: it hangs past the bound, or fails with an
error that does not name what distdoctor names.
"""

from __future__ import annotations

import sys
import time

import pytest

from host_worlds import (
    MASTER_PORT,
    RankSpec,
    WorldRun,
    base_env,
    check_statuses,
    distdoctor_world,
    findings,
    plain_torch_world,
    scenario_deadline,
    text_of,
)
from tests.conftest import deadline_bound, measured_startup_s, slack_s

pytestmark = pytest.mark.hosts

TORCH_BOUND = 10.0  # how long plain torch is watched before it is killed
A = RankSpec("hosta", 0)
B = RankSpec("hostb", 1)
# Every rank prints its own report, so a fault only one rank sees (its own interface, a
# partition on its side) can be asserted where it is seen, not only in rank 0's summary.
ALL_RANKS = ("--all-ranks",)
# Each scenario runs as distdoctor, and (with `-m extended`) as the plain torch script in the same
# set-up: what users get today, for the table in docs/performance.md. That half compares torch, it
# does not check distdoctor, so the suite CI runs leaves it out (8 bounded runs of 10 s and more).
AS_USERS_RUN_IT = pytest.mark.parametrize("who", ["distdoctor", pytest.param("torch", marks=pytest.mark.extended)])


def assert_answered_in_time(run: WorldRun, deadline: float | None = None) -> None:
    # The deadline the run was given (scenario_deadline() measured then), never one measured again now.
    deadline = run.timeout if deadline is None else deadline
    for rank in run.ranks:
        elapsed = run.elapsed_in_distdoctor(rank)
        assert elapsed is not None, f"rank {rank} was still running past the bound\n{run.describe()}"
        assert elapsed <= deadline_bound(deadline), f"rank {rank} answered after {elapsed:.2f}s\n{run.describe()}"
        assert run.code(rank) in (0, 1, 3), f"rank {rank} exited {run.code(rank)}\n{run.describe()}"
        assert "Traceback" not in run.output(rank), run.describe()


def one_finding(report, cause: str, run: WorldRun):
    found = findings(report, cause)
    assert found, f"no {cause} finding in {[(f['id'], f['cause']) for f in report.get('findings', [])]}\n{run.describe()}"
    return found


def assert_plain_torch_is_worse(outcome, *facts: str) -> None:
    """Plain torch hung until the bound, or failed without naming any of ``facts``."""
    if outcome.hung and not any(outcome.errors.values()):
        return
    said = " ".join(outcome.errors.values())
    assert outcome.hung or not any(fact in said for fact in facts), (
        f"plain torch named {facts} itself: {outcome.summary()}")


def start_holder(lab, host: str, port: int):
    """A leftover c10d store from an earlier run, still holding ``port`` on ``host``."""
    holder = lab.spawn(host, [sys.executable, "-c",
                              "import time, torch.distributed as d\n"
                              f"s = d.TCPStore('0.0.0.0', {port}, 1, True, wait_for_workers=False)\n"
                              "print('holding', flush=True)\ntime.sleep(300)"],
                       env=base_env(), label="holder")
    deadline = time.monotonic() + 30
    while "holding" not in holder.stdout:
        assert holder.popen.poll() is None and time.monotonic() < deadline, holder.stderr[-2000:]
        time.sleep(0.05)
    return holder


# 1 -----------------------------------------------------------------------------------------
@AS_USERS_RUN_IT
def test_healthy_two_host_gloo_world(lab, who):
    if who == "torch":
        # A healthy world must finish: watched for longer than a failing one, by the load's start-up time (its two
        # ranks import torch and form a gloo group in 10 s on a quiet machine; they did not at load 10).
        outcome = plain_torch_world(lab, [A, B], "1 healthy 2-host world", bound=TORCH_BOUND + slack_s(measured_startup_s()))
        assert not outcome.hung and set(outcome.codes.values()) == {0}, outcome.summary()
        return
    run = distdoctor_world(lab, [A, B], timeout=scenario_deadline())
    assert_answered_in_time(run)
    report = run.report(0)
    assert run.code(0) == 0, run.describe()
    assert report["status"] in ("ok", "warning"), run.describe()
    assert sorted(report["world"]["ranks_reported"]) == [0, 1]
    assert report["world"]["ranks_missing"] == []
    for stage in ("rendezvous", "collective"):
        statuses = check_statuses(report, stage)
        # Passed, or skipped for a reason that does not apply here (GPU checks on CPU hosts).
        assert "pass" in statuses.values() and set(statuses.values()) <= {"pass", "skip"}, statuses
    passed = [name for name, status in check_statuses(report, "collective").items() if status == "pass"]
    assert any(name.endswith("all_reduce") for name in passed), passed  # content-verified all_reduce


# 2 -----------------------------------------------------------------------------------------
@AS_USERS_RUN_IT
def test_host_name_resolving_to_loopback_on_a_multi_host_job(lab, who):
    # Debian's installer writes "127.0.1.1 <hostname>" on every node: each rank's Gloo then
    # binds to and advertises 127.0.1.1, and the peers cannot connect to it.
    for host in ("hosta", "hostb"):
        lab.set_hosts_view(host, {host: "127.0.1.1"})
    if who == "torch":
        outcome = plain_torch_world(lab, [A, B], "2 host name -> 127.0.1.1", bound=TORCH_BOUND)
        assert_plain_torch_is_worse(outcome, "GLOO_SOCKET_IFNAME=eth0", "hosta", "hostb")
        return
    run = distdoctor_world(lab, [A, B], timeout=scenario_deadline(), args=ALL_RANKS)
    assert_answered_in_time(run)
    report = run.report(0)
    assert run.code(0) != 0
    found = one_finding(report, "wrong_interface", run)
    named = [f for f in found if "GLOO_SOCKET_IFNAME=eth0" in text_of(f)]
    assert named, f"the fix GLOO_SOCKET_IFNAME=eth0 is not named: {found}"
    hosts = {h for f in named for h in f.get("hosts", [])}
    assert {"hosta", "hostb"} <= hosts, named


# 3 -----------------------------------------------------------------------------------------
@AS_USERS_RUN_IT
def test_socket_ifname_naming_an_interface_the_host_does_not_have(make_lab, who):
    # A mixed cluster: hosta's NIC is eth0, hostb's is ens5; the job exports GLOO_SOCKET_IFNAME=eth0.
    lab = make_lab(ifnames={"hostb": "ens5"})
    specs = [RankSpec("hosta", 0, env={"GLOO_SOCKET_IFNAME": "eth0"}),
             RankSpec("hostb", 1, env={"GLOO_SOCKET_IFNAME": "eth0"})]
    if who == "torch":
        outcome = plain_torch_world(lab, specs, "3 GLOO_SOCKET_IFNAME missing on hostb", bound=TORCH_BOUND)
        assert_plain_torch_is_worse(outcome, "hostb", "ens5")
        return
    run = distdoctor_world(lab, specs, timeout=scenario_deadline(), args=ALL_RANKS)
    assert_answered_in_time(run)
    for rank in (0, 1):
        assert run.code(rank) != 0, run.describe()
    found = one_finding(run.report(0), "wrong_interface", run)
    on_b = [f for f in found if "hostb" in f.get("hosts", []) and "eth0" in text_of(f)]
    assert on_b, f"hostb's missing eth0 is not named: {found}"
    assert any("ens5" in text_of(f) for f in on_b), f"the interface hostb has (ens5) is not offered: {on_b}"
    assert not any("hosta" in f.get("hosts", []) for f in on_b), "hosta has eth0; it must not be blamed"


# 4 -----------------------------------------------------------------------------------------
@AS_USERS_RUN_IT
def test_master_addr_where_no_host_answers(lab, who):
    if who == "torch":
        outcome = plain_torch_world(lab, [A, B], "4 MASTER_ADDR with no host", bound=TORCH_BOUND,
                                    master_addr="10.231.0.99")
        assert_plain_torch_is_worse(outcome, "no host answers", "10.231.0.99 is not")
        return
    run = distdoctor_world(lab, [A, B], timeout=scenario_deadline(), master_addr="10.231.0.99", args=ALL_RANKS)
    assert_answered_in_time(run)
    for rank in (0, 1):
        report = run.report(rank)
        assert run.code(rank) != 0, run.describe()
        found = one_finding(report, "master_unreachable", run)
        assert any("10.231.0.99" in text_of(f) for f in found), found
        # Nothing answers at all (the kernel's ARP gets no reply: "no route to host"); that is
        # not packets being dropped by a firewall.
        assert not findings(report, "firewall"), f"rank {rank}: a dead address read as a firewall\n{run.describe()}"


# 5 -----------------------------------------------------------------------------------------
@AS_USERS_RUN_IT
def test_partition_is_named_firewall_and_told_apart_from_refused(lab, who):
    if who == "torch":
        qdisc = lab.partition("hostb")
        outcome = plain_torch_world(lab, [A, B], f"5 partition ({qdisc})", bound=TORCH_BOUND)
        assert_plain_torch_is_worse(outcome, "firewall", "dropped")
        return
    # Control: hostb reaches hosta, but no rank 0 ever listens on the port -> refused, which is
    # master_unreachable (the store is awaited until the deadline).
    refused = distdoctor_world(lab, [B], world_size=2, timeout=scenario_deadline(), args=ALL_RANKS)
    assert_answered_in_time(refused)
    refused_report = refused.report(1)
    assert findings(refused_report, "master_unreachable"), refused.describe()
    assert not findings(refused_report, "firewall"), refused.describe()

    qdisc = lab.partition("hostb")
    run = distdoctor_world(lab, [A, B], timeout=scenario_deadline(), args=ALL_RANKS)
    assert_answered_in_time(run)
    assert lab.dropped_packets("hostb") > 0, f"the partition ({qdisc}) dropped nothing"
    on_b = run.report(1)
    assert run.code(1) != 0, run.describe()
    found = one_finding(on_b, "firewall", run)
    assert any("hosta" in text_of(f) or "10.231.0.1" in text_of(f) for f in found), found
    assert not findings(on_b, "master_unreachable"), "a dropped connection must not read as refused"
    # Rank 0 never hears from rank 1.
    on_a = run.report(0)
    assert 1 in on_a["world"]["ranks_missing"], run.describe()


# 6 -----------------------------------------------------------------------------------------
@AS_USERS_RUN_IT
def test_master_port_taken_on_the_master_host(lab, who):
    holder = start_holder(lab, "hosta", MASTER_PORT)
    if who == "torch":
        outcome = plain_torch_world(lab, [A, B], "6 MASTER_PORT taken by a leftover store", bound=TORCH_BOUND)
        assert_plain_torch_is_worse(outcome, str(holder.pid))
        return
    run = distdoctor_world(lab, [A, B], timeout=scenario_deadline())
    assert_answered_in_time(run)
    report = run.report(0)
    assert run.code(0) != 0
    found = one_finding(report, "port_in_use", run)
    assert any(str(holder.pid) in text_of(f) and str(MASTER_PORT) in text_of(f) for f in found), (
        f"the holder's PID {holder.pid} is not named: {found}")
    assert any("hosta" in f.get("hosts", []) for f in found), found


# 7 -----------------------------------------------------------------------------------------
@AS_USERS_RUN_IT
def test_rank_that_never_starts_on_the_second_host(lab, who):
    # Two ranks per host, numbered node by node as torchrun does; rank 3 never starts on hostb.
    specs = [RankSpec("hosta", 0, local_rank=0, local_world_size=2),
             RankSpec("hosta", 1, local_rank=1, local_world_size=2),
             RankSpec("hostb", 2, local_rank=0, local_world_size=2),
             RankSpec("hostb", 3, local_rank=1, local_world_size=2, start=False)]
    if who == "torch":
        outcome = plain_torch_world(lab, specs, "7 rank 3 never starts on hostb", bound=TORCH_BOUND, world_size=4)
        assert_plain_torch_is_worse(outcome, "hostb", "rank 3")
        return
    # Rank 0 waits for rank 3 until the deadline anyway.
    run = distdoctor_world(lab, specs, world_size=4, timeout=scenario_deadline())
    assert_answered_in_time(run)
    report = run.report(0)
    assert run.code(0) == 1, run.describe()
    assert report["world"]["ranks_missing"] == [3]
    found = one_finding(report, "rank_missing", run)
    assert any(3 in f.get("ranks", []) for f in found), found
    assert any("hostb" in f.get("hosts", []) for f in found), f"rank 3's host (hostb) is not named: {found}"


# 8 -----------------------------------------------------------------------------------------
@AS_USERS_RUN_IT
def test_second_host_started_with_a_different_world_size(lab, who):
    specs = [A, RankSpec("hostb", 1, env={"WORLD_SIZE": "3"})]
    if who == "torch":
        outcome = plain_torch_world(lab, specs, "8 WORLD_SIZE=3 on hostb, 2 on hosta", bound=TORCH_BOUND, world_size=2)
        assert_plain_torch_is_worse(outcome, "WORLD_SIZE")
        return
    run = distdoctor_world(lab, specs, world_size=2, timeout=scenario_deadline())
    assert_answered_in_time(run)
    report = run.report(0)
    assert run.code(0) != 0
    found = one_finding(report, "rank_config_error", run)
    about = [f for f in found if "WORLD_SIZE" in text_of(f)]
    assert about, found
    assert any(1 in f.get("ranks", []) or "hostb" in f.get("hosts", []) for f in about), about
