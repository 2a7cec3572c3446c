"""The guard in real 2-rank gloo worlds on loopback (each rank asserts what it saw)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distdoctor.testing import run_distributed

pytestmark = pytest.mark.multiproc
SCENARIOS = str(Path(__file__).with_name("guard_scenarios.py"))


def run(name: str, timeout: float = 90, **kwargs):
    result = run_distributed(f"guard_scenarios:{name}", module_file=SCENARIOS, world_size=2, timeout=timeout,
                             env={"OMP_NUM_THREADS": "1"}, **kwargs)
    assert result.ok, result.failure_message()
    return result


def line_of(tag: str) -> str:
    for number, text in enumerate(Path(SCENARIOS).read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# LINE:{tag}"):
            return f"guard_scenarios.py:{number}"  # the guard shows paths relative to the rank's cwd
    raise AssertionError(tag)


def test_shape_mismatch_raises_on_both_ranks_naming_each_line():
    run("shape_mismatch")


def test_dtype_mismatch_raises_on_both_ranks_naming_each_line():
    run("dtype_mismatch")


def test_collectives_in_a_different_order_raise_on_both_ranks():
    run("order_mismatch")


def test_a_healthy_loop_passes_with_no_findings():
    run("healthy_loop")


def test_a_dropped_isend_is_reported_with_its_line(tmp_path):
    seen = tmp_path / "seen"
    result = run_distributed("guard_scenarios:dropped_isend", module_file=SCENARIOS, world_size=2, timeout=90,
                             kwargs={"seen_file": str(seen)}, env={"OMP_NUM_THREADS": "1"})
    assert seen.exists(), result.failure_message()
    assert f"{line_of('dropped')} in dropped_isend: the Work was dropped without wait()" in seen.read_text()
    if not result.ok:
        # The receive never completed: the hang diagnosis names the dropped send, and the job ends.
        # Messages carry the guard's headline; outputs may be cut by torch's store warnings at exit.
        output = "".join(r.message + r.output for r in result.ranks.values())
        assert all(r.status == "failed" for r in result.ranks.values()), result.failure_message()
        assert "Rank 0 dropped isend #0 to rank 1 at" in output and "rank 1 waits in recv #0 from rank 0" in output, output


def test_a_work_pending_at_destroy_is_reported(tmp_path):
    run("pending_at_destroy", kwargs={"report_dir": str(tmp_path)})


def test_a_sleeping_rank_is_named_as_straggler_within_the_hang_timeout(tmp_path):
    marker = tmp_path / "sleep-started"
    hang_timeout = 3.0
    # grace: the sleeping rank reads rank 0's verdict at its quiet poll, then ends; slack for a loaded machine.
    result = run_distributed("guard_scenarios:straggler", module_file=SCENARIOS, world_size=2, timeout=90, grace=15.0,
                             kwargs={"line_file": str(marker)},
                             env={"OMP_NUM_THREADS": "1", "DISTDOCTOR_REPORT_DIR": str(tmp_path)})
    assert not result.ok
    assert marker.exists(), result.failure_message()
    # Both ranks end with the guard's exit code and fail with its report (not a harness timeout).
    assert {r.exitcode for r in result.ranks.values()} == {1}, result.failure_message()
    assert all(r.status == "failed" and "GuardError" in r.message for r in result.ranks.values())
    reports = list(tmp_path.glob("distdoctor-guard-hang-rank*.json"))
    assert len(reports) == 1, result.failure_message()
    # The verdict (its report written) within hang_timeout + 5 s, the promise, with 3 s of slack for
    # a loaded machine; the processes' teardown after it is not part of the promise.
    elapsed = reports[0].stat().st_mtime - float(marker.read_text())
    assert elapsed < hang_timeout + 5 + 3, elapsed
    report = json.loads(reports[0].read_text())
    assert report["schema"] == "distdoctor.report/1"
    [finding] = [f for f in report["findings"] if f["id"] == "job.E002"]
    assert finding["cause"] == "straggler_rank" and finding["ranks"] == [1]
    # The late rank's line (its source shown) and the waiting rank's line, from their snapshots.
    assert f"`time.sleep(60)  # LINE:sleep` at tests/guard/{line_of('sleep')}" in finding["title"], finding["title"]
    assert f"rank 0 waits in" in finding["detail"] and f"at tests/guard/{line_of('wait')}" in finding["detail"]
    snaps = {s["rank"]: s for s in finding["data"]["snapshots"]}
    assert snaps[1]["where"]["line"] == int(line_of("sleep").rsplit(":", 1)[1]) and snaps[0]["source"] == "guard"
    output = "".join(r.output for r in result.ranks.values())
    assert "job.E002 [straggler_rank]" in output or "straggler_rank" in output, output


def test_a_rank_that_left_its_loop_is_named_uneven_inputs():
    run("uneven_loop")


def test_a_frozen_rank_is_named_missing():
    result = run_distributed("guard_scenarios:frozen_rank", module_file=SCENARIOS, world_size=2, timeout=90,
                             env={"OMP_NUM_THREADS": "1"})
    rank0 = result.ranks[0]
    assert rank0.status == "failed" and rank0.exitcode == 1, result.failure_message()
    assert rank0.message.startswith("GuardError: job.E004 [rank_missing] Rank 1 did not answer"), rank0.message
    assert "is stopped (SIGSTOP" in rank0.message, rank0.message  # its process, read from /proc
    assert f"at tests/guard/{line_of('frozen')}" in rank0.message, rank0.message
    assert result.ranks[1].status in ("killed", "timeout"), result.failure_message()


def test_a_process_group_destroyed_and_created_again_is_guarded_again():
    run("recreated_group")
