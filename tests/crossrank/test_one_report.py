"""The self-test prints exactly one report when a rank cannot take part: critical local findings, a
local check outliving the run's deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import deadline_bound, json_objects, recent_startup_s

pytestmark = pytest.mark.multiproc
# The deadline counts from the CLI's start; the interpreter's start comes before it, and the load's delays
# (deadline_bound scales them with the measured start-up).
SLACK_S = 2.0 + 5.0


def world_timeout() -> float:
    """A self-test world's deadline: its two ranks' start-up timed now, and room for the stages (a fixed 20 s
    was spent importing torch at the load of three test workers: the report came before the ranks' findings)."""
    return round(12 + 3 * recent_startup_s())
SLOW_CHECK = '''
import time
from distdoctor import check


@check(stage="local")
def outlives_the_deadline(ctx):
    time.sleep(120)
'''


def _selftest(*args: str, timeout: float | None = None) -> tuple[list[dict], str, int, float]:
    timeout = world_timeout() if timeout is None else timeout
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "distdoctor", "check", "--nproc", "2", "--format", "json",
                             "--timeout", str(timeout), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout + SLACK_S + 10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=10)
    return json_objects(out), err, proc.returncode, time.monotonic() - started


@pytest.mark.parametrize("args, finding", [
    (("--backend", "mpi"), "backend.C002"),
    (("--init-method", "tcp://[::1"), "launch.C007"),
], ids=["mpi-not-built", "bad-init-method"])
def test_critical_local_findings_on_every_rank_make_one_report(args, finding):
    reports, err, code, took = _selftest(*args)
    assert "Traceback" not in err, err[-3000:]
    assert len(reports) == 1, f"{len(reports)} reports"
    (report,) = reports
    ids = {f["id"]: f for f in report["findings"]}
    assert finding in ids and ids[finding]["ranks"] == [0, 1], report["findings"]
    assert report["world"]["ranks_reported"] == [0, 1] and code == 1
    skipped = [c for c in report["checks"] if c["stage"] == "collective"]
    assert skipped and all(c["status"] == "skip" for c in skipped), skipped


def test_a_local_check_outliving_the_deadline_makes_one_report(tmp_path):
    (tmp_path / "slowpoke.py").write_text(SLOW_CHECK)
    timeout = 8.0
    reports, err, code, took = _selftest("--check-timeout", "60", "--checks-dir", str(tmp_path), timeout=timeout)
    assert "Traceback" not in err, err[-3000:]
    assert len(reports) == 1, f"{len(reports)} reports"
    assert reports[0]["status"] == "incomplete" and code == 3
    assert took <= max(timeout + SLACK_S, deadline_bound(timeout, grace=2.0)), took


STARVED_RANK = '''
import json, sys, time
from types import SimpleNamespace
from distdoctor.core.config import Config
from distdoctor.core.report import Report
from distdoctor.world.selftest import run_selftest

def body(config, *, env, argv, all_ranks, emit, started):
    if env["RANK"] == "0":  # its report out, then no CPU until the supervisor's hard deadline has passed
        emit(Report(findings=[], incomplete=True))
        time.sleep(60)
    return SimpleNamespace(exit_code=0)

code = run_selftest(Config(timeout=float(sys.argv[1])), lambda report: print(json.dumps(report.to_dict()), flush=True),
                    nproc=2, rank_body=body)
print("exit", code, file=sys.stderr)
'''


@pytest.mark.parametrize("reports_first", [True, False], ids=["report-out", "no-report"])
def test_a_rank_ended_after_its_report_was_out_leaves_that_one_report(tmp_path, reports_first):
    """A rank starved of CPU (a loaded CI machine) was ended by the supervisor's hard deadline between printing
    the bench's partial report and its exit: the supervisor printed a second one. Its twin: a rank ended before
    any report was out gets the supervisor's."""
    script = tmp_path / "starved.py"
    script.write_text(STARVED_RANK if reports_first else STARVED_RANK.replace("emit(Report", "(Report"))
    timeout = 2.0 + recent_startup_s()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # this checkout's distdoctor
    proc = subprocess.run([sys.executable, str(script), str(timeout)], capture_output=True, text=True,
                          timeout=timeout + 60, cwd=tmp_path, env=env)
    reports = json_objects(proc.stdout)
    assert len(reports) == 1 and reports[0]["status"] == "incomplete", proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "exit 3" in proc.stderr, proc.stderr[-3000:]
    supervisors = [f["id"] for f in reports[0]["findings"]] == ["core.E004"]  # "Rank 0 ... was ended"
    assert supervisors != reports_first, reports[0]
