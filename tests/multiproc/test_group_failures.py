"""A process group that cannot form, and rank 0's store going away: nobody waits for a deadline.

Real processes on loopback. The fault is real too: GLOO_SOCKET_IFNAME names an interface this
host does not have, so gloo stops with "Unable to find address for: ddnoif0" on that rank.
"""

from __future__ import annotations

import time

import psutil
import pytest

from tests.conftest import deadline_bound, recent_startup_s
from conftest import base_env, by_name, diagnostics, distdoctor, findings
from tests.conftest import free_port

pytestmark = pytest.mark.multiproc

NO_SUCH_IFACE = "ddnoif0"


def start_pair(procs, port: int, *args: str, rank1_env: dict | None = None, env: dict | None = None):
    started = []
    for rank in (0, 1):
        rank_env = base_env(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                            **(env or {}))
        if rank == 1:
            rank_env.update(rank1_env or {})
        started.append(procs.start(distdoctor("check", "--format", "json", *args), rank_env))
    return started


def test_rank_0_skips_the_collectives_when_a_ranks_local_findings_show_the_group_cannot_form(procs):
    # The group's own timeout would be 80 % of --check-timeout (32 s): the answer must not wait
    # for it. Timed on distdoctor's own clock (the report's duration), which a loaded machine's
    # slow interpreter start does not touch; well under 32 s even at load 10 on 2 cores.
    rank0, rank1 = start_pair(procs, free_port(), "--timeout", "60", "--check-timeout", "40",
                              rank1_env={"GLOO_SOCKET_IFNAME": NO_SUCH_IFACE})
    procs.wait(90)
    assert rank0.rc == 1 and rank1.rc == 1, diagnostics(rank0) + diagnostics(rank1)
    took = rank0.report()["duration_s"]
    assert took < 24, f"rank 0 answered after {took:.1f}s\n{diagnostics(rank0)}"
    report = rank0.report()
    (local,) = findings(report, "net.E008")
    assert local["ranks"] == [1] and NO_SUCH_IFACE in local["title"]
    collective = [c for c in report["checks"] if c["stage"] == "collective"]
    assert collective and all(c["status"] == "skip" for c in collective), collective
    reason = by_name(report, "collective.process_group")[0]["reason"]
    assert "gloo process group cannot form" in reason and "rank 1" in reason and "net.E008" in reason, reason
    procs.assert_no_orphans()


def test_a_rank_whose_group_fails_tells_the_others_at_once(procs):
    # Without the local stage nothing predicts the failure: every rank tries the group, rank 1's
    # creation fails at once, and rank 0 (blocked in gloo's connect, 16 s timeout) must stop too.
    # (gloo's connect timeout is 80 % of --check-timeout: 32 s; timed on distdoctor's own clock.)
    rank0, rank1 = start_pair(procs, free_port(), "--timeout", "60", "--check-timeout", "40",
                              "--stage", "rendezvous", "--stage", "collective", "--all-ranks",
                              rank1_env={"GLOO_SOCKET_IFNAME": NO_SUCH_IFACE})
    procs.wait(90)
    assert rank0.rc == 1 and rank1.rc == 1, diagnostics(rank0) + diagnostics(rank1)
    took = rank0.report()["duration_s"]
    assert took < 24, f"rank 0 answered after {took:.1f}s\n{diagnostics(rank0)}"
    report = rank0.report()
    (failed,) = findings(report, "coll.C008")
    assert failed["cause"] == "wrong_interface" and failed["ranks"] == [1], failed
    assert NO_SUCH_IFACE in failed["title"] and "GLOO_SOCKET_IFNAME" in failed["remediation"], failed
    assert not findings(report, "coll.C001") and not findings(report, "coll.C002"), report["findings"]
    entries = {c["status"]: c for c in by_name(report, "collective.process_group")}
    assert entries["fail"]["ranks"] == [1], entries
    assert entries["skip"]["ranks"] == [0] and "rank 1 could not create the gloo process group" in entries["skip"]["reason"]
    procs.assert_no_orphans()


def listening(pid: int, port: int) -> bool:
    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                   for c in psutil.Process(pid).net_connections(kind="tcp"))
    except psutil.Error:
        return False


def test_when_rank_0_is_stuck_its_store_outlives_its_final_word(procs):
    # Rank 0 hosts the store and hangs in the rendezvous; its watchdog reports, publishes exit 3
    # and only then ends (taking the store with it). Rank 1, waiting for the decision, takes the
    # final word instead, and ends quietly: no traceback from a vanished store, no report of its own.
    # Each deadline runs on its process's own clock: rank 1 starts once rank 0's store listens, so rank 0's
    # deadline comes first, as it does when rank 0 is the one that hangs. (Started together, rank 1's clock
    # began over a second before rank 0's on a loaded machine: its deadline came first and, with no final
    # word yet, it rightly reported for itself.) The deadline leaves rank 1 its start-up before it.
    timeout = round(10 + 2 * recent_startup_s())
    port = free_port()
    env = base_env(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   DISTDOCTOR_TESTING="1", DISTDOCTOR_TEST_HANG="0:rendezvous")
    rank0 = procs.start(distdoctor("check", "--format", "json", "--timeout", str(timeout)), env)
    until = time.monotonic() + timeout
    while not listening(rank0.popen.pid, port) and time.monotonic() < until and rank0.popen.poll() is None:
        time.sleep(0.1)
    rank1 = procs.start(distdoctor("check", "--format", "json", "--timeout", str(timeout)), {**env, "RANK": "1"})
    procs.wait(timeout + 40)
    for proc in (rank0, rank1):
        assert proc.rc == 3, diagnostics(proc)
        assert proc.elapsed < deadline_bound(timeout), f"ended after {proc.elapsed:.1f}s\n{diagnostics(proc)}"
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert rank1.stdout.strip() == ""
    (cut,) = findings(rank0.report(), "core.E004")
    assert cut["check"] == "watchdog" and cut["data"]["stage"] == "rendezvous"
    procs.assert_no_orphans()
