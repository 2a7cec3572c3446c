"""`distdoctor guard -- <launcher line>`: the same faults in an unmodified script, under torchrun."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import guard_torchrun  # noqa: E402 - a helper beside this file
from guard_torchrun import REPO, reports

pytestmark = pytest.mark.multiproc
SCRIPT = Path(__file__).with_name("scripts") / "faulty_job.py"


def line_of(tag: str) -> str:
    return guard_torchrun.line_of(SCRIPT, tag)


def guarded_run(fault: str, tmp_path: Path, *options: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    return guard_torchrun.guarded_run(SCRIPT, [fault], tmp_path, *options, timeout=timeout)


@pytest.mark.parametrize("fault, finding_id, cause, tags", [
    ("shape", "guard.E001", "shape_mismatch", ("shape", "shape")),
    ("dtype", "guard.E002", "dtype_mismatch", ("dtype", "dtype")),
    ("order", "guard.E004", "collective_mismatch", ("order0", "order1")),
])
def test_a_mismatch_in_an_unmodified_script_is_named_on_both_ranks(tmp_path, fault, finding_id, cause, tags):
    result, _ = guarded_run(fault, tmp_path)
    assert result.returncode != 0, result.stdout[-4000:]
    for rank, tag in enumerate(tags):
        assert f"[rank{rank}]:   {finding_id} [{cause}]" in result.stdout, result.stdout[-4000:]
        assert f"rank {rank}: " in result.stdout and f"at {line_of(tag)}" in result.stdout, result.stdout[-4000:]
    [report] = reports(tmp_path, "mismatch")
    assert report["schema"] == "distdoctor.report/1" and report["world"]["launcher"] == "torchrun"
    assert [f["id"] for f in report["findings"]] == [finding_id]
    calls = report["findings"][0]["data"]["calls"]
    assert [calls[str(r)]["site"] for r in (0, 1)] == [line_of(t) for t in tags]


def test_a_straggler_in_an_unmodified_script_is_named_and_with_on_hang_exit_the_job_ends(tmp_path):
    hang_timeout = 3
    result, seconds = guarded_run("straggler", tmp_path, "--hang-timeout", str(hang_timeout), "--on-hang", "exit")
    assert result.returncode != 0
    assert "job.E002 [straggler_rank] Rank 1 has not arrived at all_reduce #" in result.stdout, result.stdout[-4000:]
    assert f"`time.sleep(120)  # LINE:sleep` at {line_of('sleep')}" in result.stdout
    assert f"rank 0 waits in all_reduce #" in result.stdout and f"at {line_of('wait')}" in result.stdout
    # Start-up (two torch imports on a loaded machine) is in this figure; the sleep is 120 s.
    assert seconds < 60, seconds
    [report] = reports(tmp_path, "hang")
    [finding] = report["findings"]
    assert finding["cause"] == "straggler_rank" and finding["ranks"] == [1]
    late = next(s for s in finding["data"]["snapshots"] if s["rank"] == 1)
    assert f"{late['where']['file']}:{late['where']['line']}" == line_of("sleep")


def test_a_dropped_isend_in_an_unmodified_script_is_reported(tmp_path):
    result, _ = guarded_run("dropped", tmp_path, "--hang-timeout", "3")
    assert (f"guard.E009 [collective_timeout_hang] isend #0 to rank 1 at {line_of('dropped')} in <module>: "
            "the Work was dropped without wait()") in result.stdout, result.stdout[-4000:]


def test_a_rank_that_finished_its_loop_early_is_named_instead_of_a_closed_connection(tmp_path):
    result, _ = guarded_run("uneven", tmp_path, "--hang-timeout", "10")
    assert result.returncode != 0
    # The guarded all_reduce (the user's call), not the guard's own verification all_gather inside it.
    expected = r"job\.E003 \[uneven_inputs\] Rank 1 left the job while rank 0 still waits in all_reduce (#\d+ )?\(float32\[4\]\)"
    assert re.search(expected, result.stdout), result.stdout[-4000:]
    assert f"at {line_of('loop')}" in result.stdout and "Connection closed by peer" in result.stdout


def test_usage_errors_exit_2_before_anything_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for args in (["--hang-timeout", "soon", "--", "true"], ["--verify", "every", "--", "true"],
                 ["--", "no-such-command-here"]):
        result = subprocess.run([sys.executable, "-m", "distdoctor", "guard", *args], env=env, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr and ("Error" in result.stderr or "error" in result.stderr), result.stderr
