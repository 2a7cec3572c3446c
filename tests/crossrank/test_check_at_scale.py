"""`distdoctor check` at 32 ranks on this machine: it ends OK, torch's C++ lines stay off the terminal, and a
fault at that scale is still named (the twin); the pieces behind it (native output held, stage deadlines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from distdoctor.world import native_output
from distdoctor.world.stage_deadline import arrival_spread, collective_check_s, stage_need_s, why
from distdoctor.world.store_exchange import Arrival
from tests.conftest import json_objects

NPROC = 32
TIMEOUT_S = 150.0
# What torch's C++ layer prints, never distdoctor: glog's "[W1127 07:10:06.614 socket.cpp:469] [c10d] ...",
# a C++ stack trace's "frame #3: ...", "Exception raised from ...".
NATIVE_MARKS = ("[c10d]", "socket.cpp", "frame #", "Exception raised from", "TCPStore.cpp", "ProcessGroupGloo")


def run_check(*extra: str, env: dict | None = None) -> tuple[dict, str, int]:
    proc = subprocess.run([sys.executable, "-m", "distdoctor", "check", "--nproc", str(NPROC), "--format", "json",
                           "--timeout", str(TIMEOUT_S), *extra], capture_output=True, text=True,
                          timeout=TIMEOUT_S + 60, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    reports = json_objects(proc.stdout)
    assert len(reports) == 1, (proc.stdout[-2000:], proc.stderr[-2000:])
    return reports[0], proc.stderr, proc.returncode


@pytest.fixture(scope="module")
def healthy():
    return run_check()


@pytest.fixture(scope="module")
def faulty():
    # Every rank names an interface this host does not have: gloo cannot form the group.
    return run_check(env={"GLOO_SOCKET_IFNAME": "nosuch0"})


@pytest.mark.multiproc
@pytest.mark.at_scale
def test_32_ranks_end_ok_with_every_collective_passed(healthy):
    report, _, code = healthy
    assert code == 0 and report["status"] in ("ok", "warning"), report["findings"]
    assert report["world"]["ranks_reported"] == list(range(NPROC)) and report["world"]["ranks_missing"] == []
    bad = [f for f in report["findings"] if f["severity"] in ("error", "critical") or f["id"] == "core.W003"]
    assert not bad, bad
    collective = {c["name"]: c["status"] for c in report["checks"] if c["stage"] == "collective"}
    assert collective["collective.process_group"] == "pass" and collective["collective.all_reduce"] == "pass"


@pytest.mark.multiproc
@pytest.mark.at_scale
def test_32_ranks_print_no_native_trace_on_the_terminal(healthy):
    _, stderr, _ = healthy
    assert not [line for line in stderr.splitlines() if any(mark in line for mark in NATIVE_MARKS)], stderr[-3000:]
    assert "Traceback" not in stderr


@pytest.mark.multiproc
@pytest.mark.at_scale
def test_the_twin_a_fault_on_32_ranks_is_named_once_for_all_of_them(faulty):
    report, stderr, code = faulty
    assert code == 1
    (named,) = [f for f in report["findings"] if f["id"] == "net.E008"]
    assert named["ranks"] == list(range(NPROC)) and "nosuch0" in named["title"]
    skipped = [c for c in report["checks"] if c["name"] == "collective.process_group"]
    assert skipped and all(c["status"] == "skip" for c in skipped)
    # The skip reason names the ranks as ranges, not thirty-two lines.
    assert any(f"ranks 0-{NPROC - 1}" in (c.get("reason") or "") for c in skipped), skipped
    assert not [line for line in stderr.splitlines() if any(mark in line for mark in NATIVE_MARKS)]


HOLD = textwrap.dedent("""
    import os, sys
    from distdoctor.world.native_output import NativeOutput
    held = NativeOutput.capture()
    os.write(2, b"[W1127 07:10:06.614042676 socket.cpp:469] [c10d] waitForInput: socket timed out after 1600ms\\n")
    os.write(2, b"[W1127 07:10:06.714042676 socket.cpp:469] [c10d] waitForInput: socket timed out after 1700ms\\n")
    sys.stderr.write("distdoctor: a line of distdoctor's own\\n")
    print(__import__("json").dumps(held.summary()))
    held.restore()
    os.write(2, b"after restore\\n")
""")


def test_what_cpp_writes_on_descriptor_2_is_held_and_summarised_while_pythons_stderr_stays():
    proc = subprocess.run([sys.executable, "-c", HOLD], capture_output=True, text=True, timeout=60)
    assert proc.stderr == "distdoctor: a line of distdoctor's own\nafter restore\n"
    summary = json.loads(proc.stdout)
    assert summary["lines"] == 2 and summary["shapes"][0][0] == 2  # one shape: they differ only in numbers
    assert summary["shapes"][0][1].startswith("[c10d] waitForInput")  # glog's prefix is off


def test_every_ranks_summary_merges_into_a_few_lines_naming_the_ranks():
    one = native_output.summarise(["[c10d] socket timed out after 1600ms"] * 3)
    total, ranks, lines = native_output.merged_lines({r: one for r in range(4096) if r != 7} | {7: {"lines": 0}})
    assert total == 3 * 4095 and ranks == [r for r in range(4096) if r != 7]
    assert lines == ["12285x on ranks 0-6, 8-4095: [c10d] socket timed out after 1600ms"]
    assert native_output.merged_lines({0: {"lines": "x"}, 1: None}) == (0, [], [])  # malformed: nothing


def test_the_collective_deadline_follows_the_spread_and_the_size():
    assert collective_check_s(10.0, 0.3, 2) == 10.0  # a small world keeps --check-timeout
    assert collective_check_s(10.0, 5.0, 32) == 13.2
    assert collective_check_s(10.0, 17.0, 48) == 26.8
    assert arrival_spread([Arrival(0, 1, 2.0), Arrival(1, 1, 19.5), Arrival(1, 2, 40.0)]) == 17.5  # first claims
    assert stage_need_s(5.0, 32) == pytest.approx(8.2)
    assert "32 ranks checked in over 5.0 s" in why(13.2, 10.0, 5.0, 32)


def test_a_group_that_does_not_form_says_which_ranks_had_not_started_and_which_waited():
    torch_dist = pytest.importorskip("torch.distributed")
    from distdoctor.checks.collective import pg_failure
    from distdoctor.world.store_exchange import World
    from distdoctor.world.store_open import WorldSpec

    store = torch_dist.HashStore()
    worlds = [World(WorldSpec(r, 48, "127.0.0.1", 29500, "rank0", "distdoctor/t", "manual"), store) for r in range(48)]
    for world in worlds[:40]:
        world._mark_quietly("pg/gloo/entered")
    for world in worlds[:10]:
        world._mark_quietly("pg/gloo/formed")
    said = worlds[0].group_progress("gloo")
    assert said == ("ranks 40-47 had not started forming it (still in an earlier check, or late); ranks 10-39 had "
                    "started and were waiting in torch's init_process_group (store reads, then connections to every "
                    "other rank)")
    worlds[0].step = "forming the gloo process group (torch's init_process_group)"
    assert worlds[0].now_doing().startswith("forming the gloo process group (torch's init_process_group): ranks 40-47")
    error = RuntimeError("wait timeout after 8000ms, keys: /pg/gloo/0//cpu//0/1")
    error.distdoctor_progress = said
    finding = pg_failure(error, "gloo", 8.0, 8.0)
    assert finding.id == "coll.C001" and "When it gave up: ranks 40-47 had not started" in finding.detail


def test_a_start_up_that_leaves_too_little_time_skips_the_collectives_naming_it():
    from distdoctor.core.config import Config
    from distdoctor.world.rank_run import RankRun

    now = [1000.0]
    run = RankRun(Config(timeout=60.0), env={"RANK": "0", "WORLD_SIZE": "32", "MASTER_ADDR": "127.0.0.1",
                                             "MASTER_PORT": "29500"}, argv=[], clock=lambda: now[0], started=1000.0,
                  watchdog=False)
    now[0] = 1000.0 + 50.0  # the start-up took 50 of the 60 s: 4 s of working time are left
    reason = run._no_time_for_collectives({"need_s": 8.2, "spread_s": 5.0, "startup_s": [38.0, 49.5]})
    assert reason is not None and "too little for the collective stage" in reason and run.out_of_time
    (finding,) = [f for f in run.runner.state.findings if f.id == "core.E005"]
    assert "start-up had taken 50.0s" in finding.detail and "each rank took 38.0-49.5s" in finding.detail
    now[0] = 1000.0 + 10.0
    assert run._no_time_for_collectives({"need_s": 8.2, "spread_s": 5.0, "startup_s": None}) is None


def test_a_ranks_extra_store_clients_are_opened_at_its_own_moment_and_handed_out_once():
    import time as clock
    from datetime import timedelta

    from distdoctor.world.store_clients import SLOT_S, SpareClients, connect_delay

    assert connect_delay(0) == 0 and connect_delay(3) == 3 * SLOT_S and connect_delay(64) == 0
    opened: list[tuple[float, timedelta]] = []

    class Client:
        def __init__(self, timeout):
            self.timeout = timeout
            opened.append((clock.monotonic(), timeout))

        def set_timeout(self, timeout):
            self.timeout = timeout

    spares = SpareClients(Client, rank=5)
    began = clock.monotonic()
    spares.open_soon(timedelta(seconds=30))
    group = spares.take("group", timedelta(seconds=8), wait_s=2.0)
    assert group.timeout == timedelta(seconds=8) and len(opened) == 2
    assert opened[0][0] - began >= connect_delay(5) - 0.01  # not before its slot
    assert spares.take("group", timedelta(seconds=3)).timeout == timedelta(seconds=3) and len(opened) == 3  # a new one
