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
        assert set(ids(report)) <= {"stacks.I002", "job.I002"}, report["findings"]  # read while it still ran


def _sleepers(started, count: int, job: str, folder) -> list[int]:
    """count Python processes that sleep, each a rank of one job (found by SLURM_JOB_ID=job)."""
    pids = []
    for rank in range(count):
        env = child_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(count), LOCAL_WORLD_SIZE=str(count),
                        MASTER_ADDR="127.0.0.1", MASTER_PORT="1", SLURM_JOB_ID=job)
        proc = subprocess.Popen([sys.executable, "-S", "-c", "import sys, time; open(sys.argv[1], 'w').close(); "
                                 "time.sleep(600)", str(folder / f"ready{rank}")], env=env, stdin=subprocess.DEVNULL)
        started.append(proc)
        pids.append(proc.pid)
    deadline = time.monotonic() + 180
    while len(list(folder.glob("ready*"))) < count:  # each interpreter is up: py-spy can read it
        assert time.monotonic() < deadline, "the sleepers did not start"
        time.sleep(0.2)
    return pids


def test_64_ranks_on_one_node_are_read_in_parallel_within_the_timeout(started, tmp_path):
    pids = _sleepers(started, 64, "distdoctor-test-64", tmp_path)
    timeout = 30.0
    began = time.monotonic()
    result = distdoctor("stacks", "--format", "json", "--timeout", f"{timeout:g}", "--slurm-node", "distdoctor-test-64",
                        timeout=timeout + 60)
    took = time.monotonic() - began
    report = report_of(result)
    (job,) = report["data"]["stacks"]["jobs"]
    assert sorted(s["pid"] for s in job["snapshots"]) == sorted(pids)
    assert min(job["reads"].values()) >= 3, job["reads"]
    # Every rank sleeps outside any collective: nobody moved, nobody waits — said so, no alarm.
    idle = finding(report, "job.I002")
    assert idle is not None and idle["title"].startswith("No rank moved between reads"), ids(report)
    assert result.returncode == 0
    assert took < timeout + 20, took  # the reads' own bound, plus Python's start-up on a loaded machine


def _fake_pyspy(folder, behaviour: str, victim: int) -> dict:
    """A py-spy on PATH that is slow (sleeps) or fails for one PID and runs the real one for the others."""
    real = pyspy.find_pyspy()
    script = folder / "py-spy"
    script.write_text(f"""#!{sys.executable}
import os, sys, time
if "--pid" in sys.argv and sys.argv[sys.argv.index("--pid") + 1] == "{victim}":
    if "{behaviour}" == "slow":
        time.sleep(120)
    sys.stderr.write("Error: Failed to copy PyCodeObject\\n")
    sys.exit(1)
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
""")
    script.chmod(0o755)
    return child_env(PATH=f"{folder}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("behaviour", ["slow", "failing"])
def test_py_spy_slow_or_failing_on_one_rank_costs_only_that_rank(started, tmp_path, behaviour):
    job = f"distdoctor-test-pyspy-{behaviour}"
    pids = _sleepers(started, 3, job, tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = _fake_pyspy(bin_dir, behaviour, pids[1])
    began = time.monotonic()
    result = distdoctor("stacks", "--format", "json", "--timeout", "4", "--slurm-node", job, env=env, timeout=90)
    took = time.monotonic() - began
    report = report_of(result)
    failed = finding(report, "stacks.E004")
    assert failed is not None and failed["ranks"] == [1], ids(report)
    assert ("did not answer within" if behaviour == "slow" else "Failed to copy PyCodeObject") in failed["title"]
    partial = finding(report, "stacks.W003")
    assert partial is not None and "ranks whose stack could not be read: 1" in partial["detail"]
    (view,) = report["data"]["stacks"]["jobs"]
    assert {s["rank"] for s in view["snapshots"] if s["stack"]} == {0, 2}
    assert took < 4 + 30, took
    assert all(p.poll() is None for p in started)


def test_a_pid_taken_over_by_another_process_ends_its_rank(started, tmp_path):
    from distdoctor.stacks.proc_state import read_clock
    from distdoctor.stacks.procs import RankProcess
    from distdoctor.stacks.snapshots import read_rank

    (pid,) = _sleepers(started, 1, "distdoctor-test-reuse", tmp_path)
    first = read_clock(pid).start
    # The rank's process as an earlier read knew it started at another time: this PID is not it.
    read = read_rank(RankProcess(pid=pid, rank=0), started=first - 1)
    assert read.state.status == "exited" and "now belongs to another process" in read.state.note
    assert read.main is None
    assert read_rank(RankProcess(pid=pid, rank=0), started=first).main is not None
