"""`distdoctor stacks` on bad input: a clear finding and a clean exit code each, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from distdoctor.stacks import attach, pyspy
from distdoctor.stacks.procs import discover
from tests.stacks.stacks_jobs import child_env, distdoctor, finding, ids, report_of


def _free_pid() -> int:
    pid = 4_000_000
    while psutil.pid_exists(pid):
        pid -= 1
    return pid


@pytest.fixture
def started():
    """Processes a test starts; each is ended by its PID afterwards."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _zombie(started, code_or_signal: str) -> int:
    proc = subprocess.Popen([sys.executable, "-c", code_or_signal], env=child_env(RANK="0", WORLD_SIZE="1"))
    started.append(proc)
    deadline = time.monotonic() + 60
    while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:  # ended; not waited on yet
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc.pid


def test_a_pid_that_does_not_exist():
    pid = _free_pid()
    result = distdoctor("stacks", "--format", "json", str(pid))
    report = report_of(result)
    missing = finding(report, "stacks.E001")
    assert missing is not None and f"PID {pid}" in missing["title"] and result.returncode == 1, ids(report)


def test_a_process_that_is_not_python(started):
    sleeper = subprocess.Popen(["sleep", "600"], env=child_env(RANK="0", WORLD_SIZE="1"))
    started.append(sleeper)
    result = distdoctor("stacks", "--format", "json", str(sleeper.pid))
    report = report_of(result)
    found = finding(report, "stacks.E003")
    assert found is not None and str(sleeper.pid) in found["title"] and result.returncode == 1, ids(report)
    assert sleeper.poll() is None


def test_a_process_that_exited_is_named_with_its_exit_code(started):
    pid = _zombie(started, "import sys; sys.exit(7)")
    report = report_of(distdoctor("stacks", "--format", "json", str(pid)))
    # A rank that ended with a failure is the job diagnosis's first failure, with its code.
    ended = finding(report, "job.E004")
    assert ended is not None and "exited with code 7" in ended["title"] and ended["ranks"] == [0], ids(report)


def test_a_process_killed_by_a_signal_is_named_with_it(started):
    pid = _zombie(started, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    report = report_of(distdoctor("stacks", "--format", "json", str(pid)))
    ended = finding(report, "job.E005")
    assert ended is not None and "killed by SIGKILL" in ended["detail"], ids(report)


def test_a_clean_exit_nobody_waits_for_is_a_warning(started):
    pid = _zombie(started, "pass")
    report = report_of(distdoctor("stacks", "--format", "json", str(pid)))
    ended = finding(report, "stacks.W002")
    assert ended is not None and "exited with code 0" in ended["detail"], ids(report)


def test_no_job_found():
    found = discover(job_filter={"SLURM_JOB_ID": "no-such-job"})
    assert not found.jobs and [f.id for f in found.findings] == ["stacks.W001"]
    result = distdoctor("stacks", "--format", "json", "--slurm-node", "no-such-job")
    report = report_of(result)
    assert ids(report) == ["stacks.W001"] and result.returncode == 0


def test_a_launcher_with_no_ranks_below_it(started):
    # A torchrun-like command line whose process has no workers (here: a Python that only sleeps).
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "torchrun"], env=child_env())
    started.append(proc)
    report = report_of(distdoctor("stacks", "--format", "json", str(proc.pid)))
    assert ids(report) == ["stacks.W001"]
    assert finding(report, "stacks.W001")["title"] == f"PID {proc.pid} is a launcher with no rank process below it"


def test_usage_errors_exit_2():
    assert distdoctor("stacks", "--timeout", "0").returncode == 2
    assert distdoctor("stacks", "--slurm-job", "1", "123").returncode == 2
    assert distdoctor("stacks", "not-a-pid").returncode == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run py-spy as another user")
def test_another_users_process_is_denied_with_the_fix(started):
    """py-spy run as nobody on root's process: its real refusal is read as an attach problem."""
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    started.append(target)
    folder = tempfile.mkdtemp(prefix="distdoctor-pyspy-")  # pytest's own tmp is root-only
    try:
        binary = os.path.join(folder, "py-spy")
        shutil.copy(pyspy.find_pyspy(), binary)  # root's PATH may not be readable by nobody
        os.chmod(folder, 0o755)
        os.chmod(binary, 0o755)
        done = subprocess.run([binary, "dump", "--pid", str(target.pid), "--json", "--nonblocking"],
                              capture_output=True, text=True, timeout=60, user=65534, group=65534)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert done.returncode != 0
    assert pyspy.classify(done.returncode, done.stderr)[0] == pyspy.DENIED, done.stderr
    problem = attach.explain_denied(target.pid)
    assert problem.fix and problem.reason in ("denied", "no_cap_sys_ptrace", "ptrace_scope")


@pytest.mark.parametrize("delay", [0.0, 0.2, 0.5])
def test_a_process_exiting_while_stacks_runs_gives_a_report_whatever_the_timing(started, delay):
    """Which moment stacks catches is a race (still starting, before, during or after the dump);
    every outcome is a clean report: the process read, py-spy's failure on a half-started
    interpreter, or its end named with its exit code."""
    proc = subprocess.Popen([sys.executable, "-c", f"import sys, time; time.sleep({delay}); sys.exit(5)"],
                            env=child_env(RANK="0", WORLD_SIZE="1"))
    started.append(proc)
    result = distdoctor("stacks", "--format", "json", str(proc.pid))
    report = report_of(result)
    assert result.returncode in (0, 1), result.stderr
    ended = [f for f in report["findings"] if f["id"] in ("job.E004", "stacks.W002")]
    unread = [f for f in report["findings"] if f["id"] in ("stacks.E003", "stacks.E004")]
    if result.returncode == 1 and not unread:
        assert ended and "code 5" in ended[0]["title"] + ended[0]["detail"], report["findings"]
    elif result.returncode == 1:
        assert unread[0]["data"]["pid"] == proc.pid
    else:
        assert ids(report) == ["stacks.I002"], report["findings"]  # read while it still ran
