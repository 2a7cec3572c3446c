"""The run's deadline counts from distdoctor's own start, and running out of time is reported as such."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, distdoctor_cmd, slack_s


def run_check(args, env, bound):
    start = time.monotonic()
    proc = subprocess.run(distdoctor_cmd("check", *args), capture_output=True, text=True, env=env,
                          timeout=bound, cwd=REPO)
    return proc, time.monotonic() - start


@pytest.fixture
def env(clean_env):
    import os

    return {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}


def test_time_before_distdoctor_started_is_not_charged(env, startup_s):
    # `bash -c "A && B"` runs B in the shell's own process (exec): a deadline read from the
    # process's start time charged A's 8 s to distdoctor. Its own clock does not.
    sleep = 8
    cmd = " ".join(distdoctor_cmd("check", "--timeout", "20", "--format", "json"))
    start = time.monotonic()
    proc = subprocess.run(["bash", "-c", f"sleep {sleep} && exec {cmd}"], capture_output=True, text=True,
                          env=env, timeout=sleep + 20 + slack_s(startup_s), cwd=REPO)
    wall = time.monotonic() - start
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert report["status"] == "ok"
    # The report's duration counts from distdoctor's start: never the sleep before it.
    assert report["duration_s"] <= wall - sleep, (report["duration_s"], wall)


def test_too_short_a_deadline_is_a_partial_report_naming_the_stage(env, startup_s):
    proc, wall = run_check(["--timeout", "2", "--format", "json"], env, 30 + slack_s(startup_s))
    assert proc.returncode == 3, proc.stderr
    report = json.loads(proc.stdout)  # exactly one JSON document on stdout
    assert report["status"] == "incomplete"
    causes = {f["cause"] for f in report["findings"]}
    assert "master_unreachable" not in causes and "firewall" not in causes
    cut = [f for f in report["findings"] if f["id"] in ("core.E004", "core.E005")]
    assert cut, report["findings"]
    assert any(f["data"].get("stage") in ("local", "rendezvous", "collective") for f in cut)
    skipped = [c for c in report["checks"] if c["status"] == "skip"]
    assert all(c.get("reason") for c in skipped)


def test_too_short_a_deadline_is_also_reported_in_rich_text(env, startup_s):
    proc, _ = run_check(["--timeout", "2"], env, 30 + slack_s(startup_s))
    assert proc.returncode == 3, proc.stderr
    assert "INCOMPLETE" in proc.stdout
    assert " stage " in proc.stdout and "master_unreachable" not in proc.stdout


@pytest.mark.parametrize("value", ["0.5", "0", "1e9"])
def test_absurd_timeout_is_a_usage_error(env, value):
    proc, _ = run_check(["--timeout", value, "--stage", "local"], env, 120)
    assert proc.returncode == 2
    assert "timeout" in proc.stderr and "Traceback" not in proc.stderr


def test_stage_skipped_for_lack_of_time_names_it():
    from distdoctor.world.watchdog import too_little_time

    reason, finding = too_little_time("rendezvous", 0.3, 1.0, 2.0)
    assert reason.startswith("skipped:") and "rendezvous" in reason and "--timeout" in reason
    assert finding.id == "core.E005" and finding.cause == "unknown"
    assert finding.data["stage"] == "rendezvous"
