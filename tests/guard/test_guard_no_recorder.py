"""`distdoctor guard --` on the DDP tutorial's loop with torch's flight recorder off (TORCH_FR_BUFFER_SIZE=0, as
on a torch that has none): DDP's all-reduce is told from each rank's main-thread stack, and a straggler, an
exception and a killed rank are named; a healthy job, a slow data loader and a rank-0 checkpoint are not ended."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from guard_torchrun import guarded_run, line_of, reports

pytestmark = pytest.mark.multiproc
SCRIPT = Path(__file__).with_name("scripts") / "ddp_job.py"
HANG_TIMEOUT = 3.0
NO_RECORDER = {"TORCH_FR_BUFFER_SIZE": "0"}
WAIT = "backward (DDP's gradient all-reduce)"


def line(tag: str) -> str:
    return line_of(SCRIPT, tag)


def run(tmp_path: Path, fault: str, on_hang: str | None = None):
    options = ["--hang-timeout", str(HANG_TIMEOUT)] + (["--on-hang", on_hang] if on_hang else [])
    result, _ = guarded_run(SCRIPT, [fault], tmp_path, *options, env=NO_RECORDER)
    return result


def test_a_ddp_straggler_is_named_from_the_stacks_and_says_it_had_no_sequence_numbers(tmp_path):
    result = run(tmp_path, "straggler", on_hang="exit")
    out = result.stdout
    assert result.returncode != 0, out[-5000:]
    assert f"Rank 1 has not arrived at {WAIT} of the default group: at `time.sleep(120)  # LINE:sleep` at " \
           f"{line('sleep')} (confidence 80%)" in out, out[-5000:]
    assert f"rank 0 waits in {WAIT} of the default group at `loss.backward()  # LINE:backward` at {line('backward')}" in out
    [hang] = reports(tmp_path, "hang")
    assert sorted(f["id"] for f in hang["findings"]) == ["guard.I011", "job.E002"]
    [finding] = [f for f in hang["findings"] if f["id"] == "job.E002"]
    assert (finding["id"], finding["ranks"], finding["confidence"]) == ("job.E002", [1], 0.8)
    assert finding["data"]["waiting"] == [0] and finding["data"]["seq"] is None
    assert "told from the ranks' stacks, without sequence numbers" in finding["detail"]
    # Each rank's snapshot says how long it has stayed: rank 0 in the wait, rank 1 at its line.
    snaps = {s["rank"]: s for s in finding["data"]["snapshots"]}
    assert snaps[0]["in_collective"] == WAIT and snaps[0]["still_s"] >= HANG_TIMEOUT - 0.5
    assert snaps[1]["in_collective"] is None and snaps[1]["still_s"] > 0
    # The stall was reported past the hang timeout, and within it plus slack for a loaded 2-core machine.
    waited = float(re.search(r"a collective has not completed for ([\d.]+) s \(hang timeout 3 s\)", out).group(1))
    assert HANG_TIMEOUT <= waited < HANG_TIMEOUT + 8, waited


# extended: test_guard_ddp.py::test_an_exception_in_one_rank_is_named_on_the_other_ranks_with_their_failure_as_its_consequence[2]
# covers this path (the crash hook names rank 1's error in every report; the recorder plays no part in it)
@pytest.mark.extended
def test_a_rank_that_raises_is_named_by_every_report(tmp_path):
    result = run(tmp_path, "raise")
    out = result.stdout
    assert result.returncode != 0
    assert "distdoctor guard (rank 1): this rank raised ValueError" in out, out[-5000:]
    found = reports(tmp_path, "exception") + reports(tmp_path, "hang")
    assert found, out[-5000:]
    for report in found:
        finding = report["findings"][0]
        assert (finding["id"], finding["ranks"]) == ("job.E001", [1]) and f"at {line('raise')}" in finding["detail"]


def test_a_rank_killed_by_sigkill_is_named_as_the_rank_that_ended(tmp_path):
    result = run(tmp_path, "kill")
    out = result.stdout
    assert result.returncode != 0
    named = re.search(rf"job\.E004 \[rank_missing\] Rank 1 ended while the others wait in {re.escape(WAIT)}", out) or \
        re.search(r"job\.E005 \[oom_killed_rank\] Rank 1 was killed by SIGKILL", out)
    assert named, out[-5000:]
    [report] = reports(tmp_path, "exception")
    assert report["findings"][0]["ranks"] == [1]


def test_a_healthy_ddp_job_exits_0_and_reports_nothing(tmp_path):
    result = run(tmp_path, "healthy")
    out = result.stdout
    assert result.returncode == 0, out[-5000:]
    said = [ln for ln in out.splitlines() if "distdoctor guard" in ln]
    assert len(said) == 1 and "guard.I011" in said[0] and "without sequence numbers" in said[0], said
    assert "rank 0 done" in out and "rank 1 done" in out
    assert not list(tmp_path.glob("distdoctor-guard-*")) and not (tmp_path / "stalls.json").exists()


def test_a_slow_data_loader_is_no_stall_and_a_rank0_checkpoint_is_reported_not_ended(tmp_path):
    """The default policy, hang timeout 3 s. First rank 1 takes 0.3 s for each of 20 batches: rank 0 waits in DDP's
    all-reduce at the same line look after look, with little CPU between the looks, but it leaves the wait every
    step: no stall. Then rank 0 saves alone for 8 s while rank 1 waits: one stall, reported and watched; exit 0."""
    result = run(tmp_path, "pauses")
    out = result.stdout
    assert result.returncode == 0, out[-6000:]
    assert "rank 0 done" in out and "rank 1 done" in out
    assert out.count("has not completed for") == 1, out[-6000:]  # the checkpoint alone
    assert re.search(rf"job\.E002 \[straggler_rank\] Rank 0 has not arrived at {re.escape(WAIT)} of the default group: "
                     rf"at `time\.sleep\(seconds\)  # LINE:checkpoint` at {re.escape(line('checkpoint'))} "
                     r"\(confidence 80%\)", out), out[-6000:]
    assert "the guard watches: " in out and "the guard ends the job" not in out
    closed = re.search(rf"rank 0 arrived after ([\d.]+) s \({re.escape(WAIT)} of the default group\); stall 1 is over", out)
    assert closed and HANG_TIMEOUT < float(closed.group(1)) <= 8 + 4, out[-6000:]
    [stall] = json.loads((tmp_path / "stalls.json").read_text())
    assert (stall["late_rank"], stall["waiting_ranks"], stall["verdict"], stall["op"], stall["seq"], stall["action"]) == \
        (0, [1], "job.E002", WAIT, None, "watch")
    assert stall["where"] == line("checkpoint")
