"""`distdoctor guard --` on the DDP tutorial's loop and on FSDP under torchrun: the collectives issued in
C++ are counted, and a straggler, an exception, uneven inputs and a killed rank are named by rank and line."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
from guard_torchrun import guarded_run, line_of, reports

pytestmark = pytest.mark.multiproc
SCRIPT = Path(__file__).with_name("scripts") / "ddp_job.py"
HANG_TIMEOUT = 4.0


def line(tag: str) -> str:
    return line_of(SCRIPT, tag)


def run(tmp_path: Path, fault: str, *args: str, nproc: int = 2, env: dict | None = None, on_hang: str = "auto"):
    result, _ = guarded_run(SCRIPT, [fault, *args], tmp_path, "--hang-timeout", str(HANG_TIMEOUT), "--on-hang", on_hang,
                            nproc=nproc, env=env)
    return result


def finding_of(output: str, finding_id: str) -> str:
    """The rendered finding (title and its indented lines) from a rank's stderr."""
    match = re.search(rf"^ *{re.escape(finding_id)} .*(\n {{4,}}.*)*", output, re.M)
    assert match, output[-5000:]
    return match.group(0)


@pytest.mark.parametrize("wrapper, nproc", [
    # extended: [ddp-4] covers this path with more ranks
    pytest.param("ddp", 2, marks=pytest.mark.extended),
    ("fsdp", 2), ("ddp", 4)])
def test_a_straggler_is_named_with_its_line_while_the_others_wait_in_a_cpp_collective(tmp_path, wrapper, nproc):
    result = run(tmp_path, "straggler", wrapper, nproc=nproc, on_hang="exit")  # the job ended at the hang timeout
    assert result.returncode != 0, result.stdout[-4000:]
    text = finding_of(result.stdout, "job.E002 [straggler_rank]")
    assert f"Rank 1 has not arrived at " in text and f"`time.sleep(120)  # LINE:sleep` at {line('sleep')}" in text
    # The others wait in the collective DDP / FSDP issued from C++ (backward's all_reduce, FSDP's all_gather).
    op = "all_reduce" if wrapper == "ddp" else r"(all_gather|reduce_scatter)"
    waiting = [r for r in range(nproc) if r != 1]
    # Ranks waiting at one place are said once ("ranks 0, 2-3 wait in ..."); data names each.
    assert re.search(rf"ranks? [\d, -]+ waits? in {op} #\d+ \(Float\[\d+\]\) of the default group at `", text), text
    if wrapper == "ddp":
        assert f"`loss.backward()  # LINE:backward` at {line('backward')}" in text, text
    # Named within hang_timeout + 2 s of the stall (slack for a loaded 2-core machine).
    [hang] = reports(tmp_path, "hang")
    slept = float(re.search(r"rank 1 sleeps from ([\d.]+)", result.stdout).group(1))
    report_file = next(tmp_path.glob("distdoctor-guard-hang-rank*.json"))
    assert report_file.stat().st_mtime - slept < HANG_TIMEOUT + 2 + 6, report_file.stat().st_mtime - slept
    assert [f["id"] for f in hang["findings"]] == ["job.E002"]
    assert hang["findings"][0]["data"]["waiting"] == waiting
    # Every rank left its snapshot and torch's own flight-recorder dump.
    for rank in range(nproc):
        assert (tmp_path / "snapshots" / f"rank{rank}.json").exists()
        dump = pickle.loads((tmp_path / "flight_recorder" / f"distdoctor_fr_rank_{rank}").read_bytes())
        assert {"version", "pg_status", "entries"} <= set(dump) and dump["entries"]
    # Every waiting rank said why it ends: the report, or the verdict in one line. The sleeping rank
    # reads the verdict at its quiet poll (1 s); on a loaded machine torchrun may end it with SIGTERM
    # first, once the others have exited.
    for rank in waiting:
        assert f"distdoctor guard (rank {rank}): the job ends, on_hang='exit' (rank " in result.stdout or \
            f"distdoctor guard (rank {rank}): a collective has not completed" in result.stdout, result.stdout[-5000:]


# extended: [2] covers this path and asserts the peer's consequence; the ranges of peers' errors are
# covered by tests/ux/test_reports_at_scale.py[*-raised]
@pytest.mark.parametrize("nproc", [2, pytest.param(4, marks=pytest.mark.extended)])
def test_an_exception_in_one_rank_is_named_on_the_other_ranks_with_their_failure_as_its_consequence(tmp_path, nproc):
    result = run(tmp_path, "raise", nproc=nproc)
    assert result.returncode != 0
    assert "[rank1]: ValueError: bad batch at step 3" in result.stdout  # the user's traceback is still printed
    assert "distdoctor guard (rank 1): this rank raised ValueError" in result.stdout, result.stdout[-5000:]
    # A peer names rank 1's error too: its collective failed when rank 1's process ended (its error is
    # the consequence), or, when that process takes longer than the hang timeout to end (a loaded
    # machine), the stall's verdict read rank 1's final snapshot. torchrun may SIGTERM a peer first;
    # rank 0 of 2 always got there in these runs.
    for report in reports(tmp_path, "exception") + reports(tmp_path, "hang"):
        finding = report["findings"][0]
        assert (finding["id"], finding["ranks"]) == ("job.E001", [1])
        assert finding["title"] == "Rank 1 raised ValueError: bad batch at step 3"
        assert f"at {line('raise')}" in finding["detail"]
    peers = [r for r in reports(tmp_path, "exception") if "consequence" in r["findings"][0]["detail"]]
    # Peers whose errors read alike are said once as ranges ("ranks 0, 2 failed with RuntimeError").
    said = [re.search(r"ranks? ([\d, \-]+) failed with RuntimeError", r["findings"][0]["detail"]) for r in peers]
    assert all(m and set(re.findall(r"\d+", m.group(1))) <= {"0", "2", "3"} for m in said), said
    if nproc == 2:
        named = ("distdoctor guard (rank 0): this rank's RuntimeError is a consequence" in result.stdout
                 or "distdoctor guard (rank 0): the guard ends the job: no rank can advance (job.E001" in result.stdout)
        assert named and (peers or reports(tmp_path, "hang")), result.stdout[-5000:]


def test_a_rank_with_one_batch_more_is_named_uneven_inputs(tmp_path):
    result = run(tmp_path, "uneven")
    assert result.returncode != 0
    text = finding_of(result.stdout, "job.E003 [uneven_inputs]")
    assert "Rank 0 left the job while rank 1 still waits in all_reduce #" in text, text
    assert f"at `loss.backward()  # LINE:backward` at {line('backward')}" in text
    assert "Join" in text  # the fix names DDP's Join context manager


def test_a_rank_killed_by_a_signal_is_named_missing_or_killed(tmp_path):
    result = run(tmp_path, "kill")
    assert result.returncode != 0
    found = re.search(r"(job\.E00[45]) \[(rank_missing|oom_killed_rank)\] Rank 1 ", result.stdout)
    assert found, result.stdout[-5000:]
    [report] = reports(tmp_path, "exception")
    assert report["findings"][0]["ranks"] == [1]


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_a_healthy_run_exits_0_with_no_finding(tmp_path, wrapper):
    result = run(tmp_path, "healthy", wrapper)
    assert result.returncode == 0, result.stdout[-5000:]
    assert "distdoctor guard" not in result.stdout and "rank 0 done" in result.stdout
    assert not list(tmp_path.glob("distdoctor-guard-*")) and not (tmp_path / "snapshots").exists()


@pytest.mark.parametrize("setting, words", [
    # extended: ['lots'] covers this path (recorder off, said once, the job runs); TORCH_FR_BUFFER_SIZE=0 itself is
    # run by test_guard_no_recorder.py::test_a_healthy_ddp_job_exits_0_and_reports_nothing (guard.I011 said once)
    pytest.param("0", "TORCH_FR_BUFFER_SIZE=0 turns torch's flight recorder off", marks=pytest.mark.extended),
    ("lots", "TORCH_FR_BUFFER_SIZE='lots' is not an integer")])
def test_a_recorder_turned_off_or_unreadable_is_said_once_and_the_job_runs(tmp_path, setting, words):
    result = run(tmp_path, "healthy", env={"TORCH_FR_BUFFER_SIZE": setting})
    assert result.returncode == 0, result.stdout[-5000:]
    lines = [ln for ln in result.stdout.splitlines() if "guard.I011" in ln]
    assert len(lines) == 1 and words in lines[0], result.stdout[-5000:]


def test_a_filestore_job_runs_and_says_it_has_no_cross_rank_view(tmp_path):
    result = run(tmp_path, "healthy", "ddp", str(tmp_path / "store"))
    assert result.returncode == 0, result.stdout[-5000:]
    lines = [ln for ln in result.stdout.splitlines() if "guard.I011" in ln]
    assert len(lines) == 1 and "no cross-rank view" in lines[0] and "not a TCPStore" in lines[0], result.stdout
