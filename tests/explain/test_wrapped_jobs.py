"""Real jobs under launchers that wrap a rank's error: explain reads through the wrapper to the rank's own.

One set of jobs for the module, run side by side (gloo, CPU, 2 ranks each): mp.spawn with world_size=3
and two processes (a store wait for a rank that never comes, under ProcessRaisedException), mp.spawn
with rank 1 raising, Lightning's Trainer(strategy="ddp") with rank 1 raising in training_step,
`accelerate launch` with rank 1 raising, and torchrun --max-restarts 1 where attempt 0's rank 1 raises
and the restart fails in init_process_group (Gloo connectFullMesh refused) — its console and, with
LOGLEVEL=INFO, its --log-dir tree — and the restarted job that recovers (its twin: no alarm for the end).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from distdoctor.explain import explain_files

JOB = Path(__file__).resolve().parent / "jobs" / "wrapped_job.py"
SOURCE = JOB.read_text().splitlines()
RAISE = {name: next(i for i, line in enumerate(SOURCE, 1) if f"def {name}" in line) for name in
         ("spawn_raise", "lightning_raise", "accelerate_raise", "elastic_restart")}
JOB_DEADLINE_S = 240  # each job ends in seconds; this bounds a wedged one on a loaded machine
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1"]


def raise_line(function: str, text: str) -> int:
    """The line of `text` inside `function` of the job (the raise the test expects to be named)."""
    start = RAISE[function]
    return next(i for i, line in enumerate(SOURCE, 1) if i > start and text in line)


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def commands(out: Path) -> dict[str, tuple[list[str], dict, int]]:
    accelerate = shutil.which("accelerate") or "accelerate"
    return {
        "spawn_missing": ([sys.executable, str(JOB), "spawn_missing"], {"PORT": free_port()}, 1),
        "spawn_raise": ([sys.executable, str(JOB), "spawn_raise"], {"PORT": free_port()}, 1),
        "lightning": ([sys.executable, str(JOB), "lightning_raise"], {"MASTER_PORT": free_port()}, 1),
        "accelerate": ([accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", free_port(),
                        str(JOB), "accelerate_raise"], {}, 1),
        "elastic": ([*TORCHRUN, str(JOB), "elastic_restart"], {}, 1),
        "elastic_dir": ([*TORCHRUN, "--redirects", "3", "--log-dir", str(out / "elastic_dir" / "logs"), str(JOB),
                         "elastic_restart"], {"LOGLEVEL": "INFO"}, 1),
        "elastic_recover": ([*TORCHRUN, str(JOB), "elastic_restart"], {"RECOVER": "1"}, 0),
    }


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("wrapped")
    procs = {}
    planned = commands(root)
    for name, (cmd, extra, _) in planned.items():
        out = root / name
        out.mkdir()
        env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
        with open(out / "console.log", "wb") as console:
            procs[name] = subprocess.Popen(cmd, env=env, stdout=console, stderr=subprocess.STDOUT, cwd=out)
    try:
        for name, proc in procs.items():
            expected = planned[name][2]
            assert proc.wait(timeout=JOB_DEADLINE_S) == expected, (name, (root / name / "console.log").read_text()[-3000:])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {name: root / name for name in procs}


def top(path: Path):
    report = explain_files([str(path)])
    return report.findings[0], report


def causes(finding) -> list[str]:
    return [c["cause"] for c in finding.data.get("candidates", [])] or [finding.cause]


def test_mp_spawn_a_store_wait_for_a_rank_that_never_came_is_read_through_process_raised_exception(jobs):
    finding, report = top(jobs["spawn_missing"] / "console.log")
    text = (jobs["spawn_missing"] / "console.log").read_text()
    assert "ProcessRaisedException" in text
    # Whichever process's store wait ended first (rank 0's barrier or rank 1's key wait: the load
    # decides), the wrapper names it, and that is the rank named.
    process = int(re.search(r"-- Process (\d) terminated with the following error", text).group(1))
    # The wrapper is not the cause; the store wait is, and a rank that never came heads it.
    assert finding.cause != "worker_exception" and "mp.spawn" not in finding.title, finding.title
    assert finding.ranks == (process,), finding.ranks
    assert "rank_missing" in causes(finding)[:2] and "world_size_mismatch" in causes(finding)[:3], causes(finding)
    assert all(c.get("tell") for c in finding.data["candidates"])
    assert all(f.cause != "worker_exception" for f in report.findings)


@pytest.mark.parametrize("name, function, text", [
    ("spawn_raise", "spawn_raise", "raise ValueError"),
    ("lightning", "lightning_raise", "raise ValueError"),
    ("accelerate", "accelerate_raise", "raise ValueError"),
])
def test_a_ranks_own_exception_under_a_launcher_is_the_cause_at_its_line(jobs, name, function, text):
    """mp.spawn prints the error of the first process it sees fail; when its parent was starved until both
    had ended (a loaded machine, CI once), that is rank 0's lost peer and rank 1's own error is in no log
    (fixtures/spawn_consequence_first.log holds such a run): then no confident answer, the peer's own
    exception among the first three."""
    finding, _ = top(jobs[name] / "console.log")
    if "-- Process 0 terminated with the following error" in (jobs[name] / "console.log").read_text():
        assert name == "spawn_raise" and finding.ranks == (0,) and "lost a peer" in finding.title, finding.title
        assert finding.confidence < 0.8 and "worker_exception" in causes(finding)[:3], causes(finding)
        return
    assert (finding.cause, finding.ranks) == ("worker_exception", (1,)), (finding.cause, finding.ranks, finding.title)
    assert "ValueError: corrupt sample in shard 1" in finding.title
    assert f"wrapped_job.py:{raise_line(function, text)}" in finding.title
    assert finding.confidence >= 0.8


@pytest.mark.parametrize("layout", ["console", "log_dir", "info_console"])
def test_a_restarted_job_is_explained_by_its_last_attempt_and_lists_the_earlier_one(jobs, layout):
    path = {"console": jobs["elastic"] / "console.log", "log_dir": jobs["elastic_dir"] / "logs",
            "info_console": jobs["elastic_dir"] / "console.log"}[layout]
    finding, report = top(path)
    text = path.read_text() if path.is_file() else ""
    if layout == "info_console":
        assert "restart_count=1" in text and "will restart worker group" in text
    # The job ended in attempt 1's init_process_group: Gloo's connectFullMesh was refused.
    assert finding.data.get("attempt") == 1 and finding.data.get("attempts") == 2, finding.data
    assert "loss became NaN" not in finding.title
    if layout == "info_console":
        # The console of --redirects holds the agent's lines only: its exit code, not its error.
        assert finding.id == "log.E037" and "its own error is not in these logs" in finding.title
    else:
        assert finding.cause != "worker_exception"
        assert "connectFullMesh" in finding.detail
        assert {"wrong_interface", "rank_missing"} <= set(causes(finding)[:3]), causes(finding)
    earlier = next(f for f in report.findings if f.id == "log.I041")
    first = earlier.data["attempts"][0]
    if layout != "info_console":
        assert (first["attempt"], first["cause"], first["ranks"]) == (0, "worker_exception", [1]), first
        assert "loss became NaN at step 2 on rank 1" in first["title"]
    else:
        assert first["attempt"] == 0


@pytest.mark.parametrize("log", [JOB.with_name("restarted_interleaved_console.log"),
                                 JOB.parent.parent / "fixtures" / "elastic_interleaved_tracebacks.log"])
def test_a_restarted_attempt_whose_ranks_tracebacks_interleave_on_one_console_is_read_by_their_error(log):
    """The `elastic` job's console when both ranks of attempt 1 printed the same connectFullMesh failure at once,
    unprefixed: in a CI run (2026-11-29, paths shortened) the second traceback's header was glued to the end of
    the first's caret line ("^^^^Traceback (most recent call last):"); in another (CI 2026-11-30, then
    make_fixtures.py elastic_interleaved_tracebacks) the two headers came back to back, the frames in turn and
    one exception line glued after the other's carets ("^^^^^^^RuntimeError^: ^Gloo ..."). Each hid both errors
    and the answer was the exit code's ("its own error is not in these logs")."""
    report = explain_files([str(log)])
    finding = report.findings[0]
    assert finding.data.get("attempt") == 1 and finding.cause != "worker_exception", finding.title
    assert "connectFullMesh" in finding.detail and {"wrong_interface", "rank_missing"} <= set(causes(finding)[:3])


def test_a_restarted_job_that_recovered_says_its_end_was_no_failure_and_lists_the_attempt_that_failed(jobs):
    path = jobs["elastic_recover"] / "console.log"
    report = explain_files([str(path)])
    finding = report.findings[0]
    # The last attempt ran to its end: no cause is invented for it.
    assert finding.data.get("attempt") == 1 and finding.cause == "unknown" and finding.id == "log.W030", finding
    assert "nothing failed" in finding.detail
    earlier = next(f for f in report.findings if f.id == "log.I041")
    assert earlier.data["attempts"][0]["cause"] == "worker_exception"
