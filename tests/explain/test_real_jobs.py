"""Real failing jobs (torchrun, 2 ranks, gloo): explain names the first failure, whatever the log layout.

One set of jobs per module (run side by side): a ValueError in rank 1 at step 3 (with and without
torch's @record, which writes TORCHELASTIC error files), one batch more on rank 1 (uneven inputs),
the same with a DDP model (rank 0 exits 0, rank 1 dies in backward with "Connection closed by
peer"), rank 1 sleeping past rank 0's 5 s collective timeout (straggler), rank 1 killed by SIGKILL,
and the healthy twin of them all (no failure: no alarm). Each job's console output (--tee, the
[defaultN]:/[rankN]: prefixes) and its --log-dir tree are read; each test judges the first verdict.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from distdoctor.explain import explain_files

JOB = Path(__file__).resolve().parent / "jobs" / "train_job.py"
RAISE_LINE = next(i for i, line in enumerate(JOB.read_text().splitlines(), 1) if "raise ValueError" in line)
SCENARIOS = {"crash": {}, "crash_record": {"RECORD": "1"}, "uneven": {}, "straggler": {}, "sigkill": {},
             "crash_guarded": {}, "ddp_uneven": {}, "healthy": {}}
JOB_DEADLINE_S = 240  # each job ends in seconds; this bounds a wedged one on a loaded machine


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, Path]:
    """Run every scenario once, side by side; scenario -> its output directory (console.log, logs/)."""
    root = tmp_path_factory.mktemp("jobs")
    procs = {}
    for name, extra in SCENARIOS.items():
        out = root / name
        out.mkdir()
        scenario = name if name in ("ddp_uneven", "healthy") else name.split("_")[0]
        env = {**os.environ, "SCENARIO": scenario, **extra, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--tee", "3", "--log-dir", str(out / "logs"), str(JOB)]
        if name == "crash_guarded":  # the same job under the runtime guard, which writes its report directory
            cmd = [sys.executable, "-m", "distdoctor", "guard", "--report-dir", str(out / "reports"), "--", *cmd]
        with open(out / "console.log", "wb") as console:
            procs[name] = subprocess.Popen(cmd, env=env, stdout=console, stderr=subprocess.STDOUT, cwd=out)
    try:
        for name, proc in procs.items():
            expected = 0 if name == "healthy" else 1
            assert proc.wait(timeout=JOB_DEADLINE_S) == expected, (root / name / "console.log").read_text()[-3000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {name: root / name for name in SCENARIOS}


def top(paths) -> tuple:
    report = explain_files([str(p) for p in paths])
    return report.findings[0], report


def causes(finding) -> list[str]:
    return [c["cause"] for c in finding.data.get("candidates", [])] or [finding.cause]


@pytest.mark.parametrize("layout", ["console", "log_dir"])
def test_an_exception_in_one_rank_is_the_cause_and_its_peers_failure_a_consequence(jobs, layout):
    path = jobs["crash"] / ("console.log" if layout == "console" else "logs")
    finding, report = top([path])
    assert (finding.cause, finding.ranks) == ("worker_exception", (1,)), finding
    assert "ValueError" in finding.title and "bad batch on rank 1" in finding.title
    assert f"train_job.py:{RAISE_LINE}" in finding.title
    assert finding.confidence >= 0.8
    # Rank 0's "Connection closed/reset by peer" (when it raised before torchrun's SIGTERM reached it)
    # is folded under it, not a finding that outranks it.
    assert "rank 0" in finding.detail
    if "by peer" in path.read_text() if path.is_file() else any("by peer" in p.read_text() for p in path.rglob("*.log")):
        assert "by peer" in finding.detail
    assert all(f.cause != "rank_missing" for f in report.findings)
    assert "without its error" not in finding.title + finding.detail


def test_torchelastic_error_files_name_the_exception_and_its_line(jobs):
    files = sorted((jobs["crash_record"] / "logs").rglob("error.json"))
    assert files, "torch's @record wrote no error file"
    finding, _ = top(files)
    assert (finding.cause, finding.ranks) == ("worker_exception", (1,))
    assert f"train_job.py:{RAISE_LINE}" in finding.title
    # The console log quotes the error file's traceback in torchrun's summary: the same answer.
    console, _ = top([jobs["crash_record"] / "console.log"])
    assert (console.cause, console.ranks) == ("worker_exception", (1,)) and f"train_job.py:{RAISE_LINE}" in console.title


def test_a_rank_that_finished_while_its_peer_waited_had_fewer_batches(jobs):
    finding, report = top([jobs["uneven"] / "console.log"])
    assert (finding.cause, finding.ranks) == ("uneven_inputs", (0,)), [(f.id, f.title, f.detail) for f in report.findings]
    assert "collective_mismatch" in causes(finding)[:3]
    # --log-dir has no exit codes: rank 0's last line ("done") says it finished.
    finding, _ = top([jobs["uneven"] / "logs"])
    assert finding.cause == "uneven_inputs" and finding.ranks == (0,)
    assert finding.confidence < 0.8


def test_a_rank_that_printed_no_error_while_its_peer_timed_out_is_the_straggler(jobs):
    finding, _ = top([jobs["straggler"] / "console.log"])
    assert (finding.cause, finding.ranks) == ("straggler_rank", (1,)), finding
    assert finding.confidence < 0.8 and {"rank_missing", "collective_mismatch"} <= set(causes(finding)[:3])
    assert "Timed out waiting 5000ms" in finding.detail
    finding, _ = top([jobs["straggler"] / "logs"])
    assert finding.ranks == (1,) and "straggler_rank" in causes(finding)[:3]


def test_a_rank_killed_by_a_signal_is_named_without_claiming_the_oom_killer(jobs):
    finding, report = top([jobs["sigkill"] / "console.log"])
    titles = [(f.id, f.title) for f in report.findings]
    assert (finding.cause, finding.ranks) == ("oom_killed_rank", (1,)), titles
    assert finding.confidence < 0.8 and "resource_limit" in causes(finding), (finding.confidence, causes(finding))
    assert len([f for f in report.findings if f.severity >= finding.severity]) == 1, titles
    # --log-dir has no exit codes: the kill shows only as rank 0's lost peer, when rank 0 raised before
    # torchrun's SIGTERM reached it (a race the launcher decides).
    finding, report = top([jobs["sigkill"] / "logs"])
    titles = [(f.id, f.title) for f in report.findings]
    if any("by peer" in p.read_text() for p in (jobs["sigkill"] / "logs").rglob("stderr.log")):
        assert finding.ranks == (1,) and {"rank_missing", "oom_killed_rank"} <= set(causes(finding)[:3]), titles
    else:
        assert finding.confidence is None or finding.confidence < 0.8, titles  # no file shows the kill


@pytest.mark.parametrize("style", ["srun", "mpirun"])
def test_srun_and_mpirun_rank_prefixes_split_the_log_by_rank(jobs, tmp_path, style):
    """The crash's console log with its torchrun prefixes rewritten as srun -l / mpirun --tag-output write them."""
    text = (jobs["crash"] / "console.log").read_text()
    text = re.sub(r"\[default(\d+)\]:(?:\[rank\d+\]: )?",
                  (lambda m: f"{m.group(1)}: ") if style == "srun" else (lambda m: f"[1,{m.group(1)}]<stderr>:"), text)
    log = tmp_path / "job.log"
    log.write_text(text)
    finding, _ = top([log])
    assert (finding.cause, finding.ranks) == ("worker_exception", (1,)) and f"train_job.py:{RAISE_LINE}" in finding.title


def test_the_guards_report_directory_is_read_as_the_same_job(jobs):
    reports = jobs["crash_guarded"] / "reports"
    assert list(reports.rglob("rank*.json")), sorted(p.name for p in reports.rglob("*"))
    finding, report = top([reports])
    assert (finding.cause, finding.ranks) == ("worker_exception", (1,)), [(f.id, f.title) for f in report.findings]
    assert f"train_job.py:{RAISE_LINE}" in finding.detail
    # With the console log beside it: still one answer for the one failure.
    finding, report = top([reports, jobs["crash_guarded"] / "console.log"])
    assert (finding.cause, finding.ranks) == ("worker_exception", (1,))
    assert len([f for f in report.findings if f.cause == "worker_exception"]) == 1, [(f.id, f.title) for f in report.findings]


def test_a_ddp_rank_with_one_batch_more_is_uneven_inputs_not_its_error(jobs):
    """Rank 0 ran out of batches and exited 0 (torchrun's summary does not list it); rank 1's backward
    then all-reduced with a peer that was gone: "Connection closed by peer" is the consequence.

    How rank 0's end reads is a race torch runs: it exits 0; or torchrun's SIGTERM (after rank 1
    failed) meets it tearing down; or it dies of SIGABRT as its interpreter ends (gloo's thread:
    "terminate called without an active exception", about 1 run in 8 here). Each says it had left."""
    console = (jobs["ddp_uneven"] / "console.log").read_text()
    assert "by peer" in console and "backward" in console, console[-2000:]
    finding, report = top([jobs["ddp_uneven"] / "console.log"])
    assert (finding.cause, finding.ranks) == ("uneven_inputs", (0,)), [(f.id, f.title) for f in report.findings]
    assert "collective_mismatch" in causes(finding)[:3]
    assert "by peer" in finding.detail
    assert "exited with code 0" in finding.detail or "its last line says it finished (rank 0 done)" in finding.detail
    # --log-dir has no exit codes: rank 0 fell silent after saying it was done; the words support
    # uneven inputs, they do not make it certain.
    finding, report = top([jobs["ddp_uneven"] / "logs"])
    assert (finding.cause, finding.ranks) == ("uneven_inputs", (0,)), [(f.id, f.title) for f in report.findings]
    assert finding.confidence < 0.8


@pytest.mark.parametrize("layout", ["console", "log_dir"])
def test_the_healthy_twin_raises_no_alarm(jobs, layout):
    path = jobs["healthy"] / ("console.log" if layout == "console" else "logs")
    report = explain_files([str(path)])
    assert report.exit_code() == 0
    alarms = [(f.id, f.title) for f in report.findings if f.severity.label in ("error", "critical")]
    assert not alarms, alarms
    assert "nothing failed" in report.findings[0].detail
