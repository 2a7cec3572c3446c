"""The self-test prints exactly one report when a rank cannot take part: critical local findings, a
local check outliving the run's deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import json_objects

pytestmark = pytest.mark.multiproc
TIMEOUT_S = 20.0
# The deadline counts from the CLI's start; the interpreter's start comes before it.
SLACK_S = 2.0 + 5.0
SLOW_CHECK = '''
import time
from distdoctor import check


@check(stage="local")
def outlives_the_deadline(ctx):
    time.sleep(120)
'''


def _selftest(*args: str, timeout: float = TIMEOUT_S) -> tuple[list[dict], str, int, float]:
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
    assert took <= timeout + SLACK_S, took
