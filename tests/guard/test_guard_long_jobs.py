"""`distdoctor guard --` on the patterns of a long training job, under torchrun: pauses that are reported
and closed (not killed), a user's own TimeoutError, a dead prefetch thread behind a stall with an uneven
all_to_all before it, and a receive cycle given one verdict by the guard, `stacks` and `explain`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from guard_torchrun import REPO, guarded_run, line_of, reports

pytestmark = pytest.mark.multiproc
SCRIPT = Path(__file__).with_name("scripts") / "long_job.py"
HANG_TIMEOUT = 3.0


def line(tag: str) -> str:
    return line_of(SCRIPT, tag)


def run(tmp_path: Path, *args: str, on_hang: str | None = None):
    options = ["--hang-timeout", str(HANG_TIMEOUT)] + (["--on-hang", on_hang] if on_hang else [])
    result, _ = guarded_run(SCRIPT, list(args), tmp_path, *options)
    return result


def test_a_rank0_checkpoint_and_a_slow_batch_are_reported_and_closed_and_the_job_finishes(tmp_path):
    """The DDP tutorial's rank-0-only snapshot (6 s) and later one slow batch on rank 1 (6 s), hang
    timeout 3 s, the default policy: both stalls named and followed to their end; exit 0."""
    result = run(tmp_path, "pauses", "6")
    out = result.stdout
    assert result.returncode == 0, out[-6000:]
    assert "rank 0 done" in out and "rank 1 done" in out
    # Two episodes, each reported once with the late rank's line, each closed with who arrived and when.
    assert re.search(rf"job\.E002 \[straggler_rank\] Rank 0 has not arrived at all_reduce #\d+ .*: at "
                     rf"`time\.sleep\(pause_s\)  # LINE:checkpoint` at {re.escape(line('checkpoint'))}", out), out[-6000:]
    assert re.search(rf"job\.E002 \[straggler_rank\] Rank 1 has not arrived at all_reduce #\d+ .*: at "
                     rf"`time\.sleep\(pause_s\)  # LINE:slowbatch` at {re.escape(line('slowbatch'))}", out), out[-6000:]
    assert out.count("the guard watches: ") == 2 and "the guard ends the job" not in out
    closed = re.findall(r"rank (\d) arrived after ([\d.]+) s \(all_reduce #\d+ of the default group\); stall (\d) is over", out)
    assert [(r, n) for r, _, n in closed] == [("0", "1"), ("1", "2")], out[-6000:]
    # The pause is 6 s; gloo marks completion up to ~0.5 s late and the watchdog polls every 0.25 s.
    assert all(5.5 <= float(s) <= 6 + 4 for _, s, _ in closed), closed
    stalls = json.loads((tmp_path / "stalls.json").read_text())
    assert [(s["late_rank"], s["waiting_ranks"], s["verdict"], s["op"]) for s in stalls] == \
        [(0, [1], "job.E002", "all_reduce"), (1, [0], "job.E002", "all_reduce")]
    assert [s["where"] for s in stalls] == [line("checkpoint"), line("slowbatch")]
    assert all(isinstance(s["seq"], int) and s["started_s"] > 0 and 5.5 <= s["seconds"] <= 10 for s in stalls)
    # The second began after the first ended; each end is seen up to a poll plus gloo's late completion
    # (~0.75 s) after it happened, and each start is read by another rank's clock: 1 s of slack.
    assert stalls[1]["started_s"] > stalls[0]["started_s"] + stalls[0]["seconds"] - 1.0
    # Rank 0's line at the end: how many, how long in all, the longest with its rank and line.
    summary = re.search(r"distdoctor guard \(rank 0\): 2 stalls past the hang timeout in this run, ([\d.]+) s waited in "
                        r"all; the longest ([\d.]+) s: rank (\d) at (\S+) in all_reduce #\d+; every stall in (\S+)", out)
    assert summary, out[-3000:]
    longest = max(stalls, key=lambda s: s["seconds"])
    assert float(summary.group(1)) == pytest.approx(sum(s["seconds"] for s in stalls), abs=0.11)
    assert (int(summary.group(3)), summary.group(4)) == (longest["late_rank"], longest["where"])
    assert summary.group(5) == str(tmp_path / "stalls.json")


def test_pauses_shorter_than_the_hang_timeout_say_nothing(tmp_path):
    result = run(tmp_path, "healthy", "0.5")
    assert result.returncode == 0, result.stdout[-5000:]
    assert "distdoctor guard" not in result.stdout and "rank 1 done" in result.stdout
    assert not (tmp_path / "stalls.json").exists() and not list(tmp_path.glob("distdoctor-guard-*"))


def test_a_users_own_timeout_error_is_that_ranks_exception_not_a_consequence(tmp_path):
    """requests' ReadTimeout and friends say "timed out": rank 1's own TimeoutError is its own failure."""
    result = run(tmp_path, "usertimeout")
    out = result.stdout
    assert result.returncode != 0
    assert "distdoctor guard (rank 1): this rank raised TimeoutError; the job ends:" in out, out[-6000:]
    assert "is a consequence" not in out.split("distdoctor guard (rank 1)")[1][:200]
    for report in reports(tmp_path, "exception") + reports(tmp_path, "hang"):
        first = report["findings"][0]
        assert (first["id"], first["ranks"]) == ("job.E001", [1]), first["title"]
        assert first["title"] == "Rank 1 raised TimeoutError: Read timed out."
        assert f"at {line('usertimeout')}" in first["detail"]
    assert reports(tmp_path, "exception"), out[-6000:]


def test_a_dead_prefetch_thread_is_shown_with_the_stall_it_causes_and_uneven_all_to_all_is_no_mismatch(tmp_path):
    result = run(tmp_path, "deadthread", on_hang="exit")
    assert result.returncode != 0
    [hang] = reports(tmp_path, "hang")
    assert [f["id"] for f in hang["findings"]] == ["job.E002"], [f["title"] for f in hang["findings"]]
    [finding] = hang["findings"]
    assert finding["ranks"] == [1] and f"`batches.get(timeout=120)  # LINE:batchwait` at {line('batchwait')}" in finding["title"]
    assert (f"rank 1: its thread 'prefetch' died with ConnectionError at `raise ConnectionError(\"storage node went "
            f"away\")  # LINE:thread` at {line('thread')}: storage node went away") in finding["detail"], finding["detail"]
    # The all_to_all_single with split sizes is in the recorder's history of both ranks: not a mismatch.
    snaps = finding["data"]["snapshots"]
    assert any(op["op"] == "all_to_all" for s in snaps for g in s["groups"] for op in g["recent"]), snaps
    assert "job.E007" not in result.stdout


def test_a_receive_cycle_gets_one_verdict_from_the_guard_stacks_and_explain(tmp_path):
    guarded = tmp_path / "guarded"
    guarded.mkdir()
    result = run(guarded, "recvcycle")
    assert result.returncode != 0
    [hang] = reports(guarded, "hang")
    [finding] = hang["findings"]
    assert (finding["id"], finding["ranks"]) == ("job.E006", [0, 1]), finding["title"]
    assert "rank 0 waits in recv from rank 1 (float32[4]) while rank 1 waits in recv from rank 0" in finding["detail"]
    assert "the guard ends the job: no rank can advance (job.E006" in result.stdout
    explained = subprocess.run([sys.executable, "-m", "distdoctor", "explain", "--format", "json", str(guarded / "snapshots")],
                               env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert [f["id"] for f in json.loads(explained.stdout)["findings"]][:1] == ["job.E006"], explained.stdout[-3000:]
    assert [f["id"] for f in stacks_on_the_same_deadlock(tmp_path / "plain")][:1] == ["job.E006"]


def stacks_on_the_same_deadlock(tmp: Path) -> list[dict]:
    """The same script without the guard; once both ranks entered their recv, `distdoctor stacks` once."""
    ready = tmp / "ready"
    ready.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTDOCTOR_", "TORCHELASTIC_"))}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            str(SCRIPT), "recvcycle", "0", str(ready)], env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while len([p for p in ready.glob("rank*") if p.read_text()]) < 2 and time.monotonic() < deadline:
            assert job.poll() is None, "the job ended before its ranks reached recv"
            time.sleep(0.2)
        time.sleep(1.0)  # from the marker to the blocking recv: one line
        looked = subprocess.run([sys.executable, "-m", "distdoctor", "stacks", "--format", "json", str(job.pid)],
                                env=env, capture_output=True, text=True, timeout=120)
        return json.loads(looked.stdout)["findings"]
    finally:
        # The launcher's workers run in sessions of their own: SIGKILL to the launcher's group
        # leaves them blocked in recv, so each is ended by the pid its marker holds.
        workers = [int(p.read_text()) for p in ready.glob("rank*") if p.read_text().strip().isdigit()]
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_lightning_job_with_one_slow_batch_is_reported_not_killed(tmp_path):
    """Trainer(strategy="ddp") on 2 CPU processes (Lightning starts the second itself), `distdoctor
    guard -- python job.py`: rank 1's 8 s batch is named and closed, the job finishes. Lightning is
    not in the test extra (30 MB, about a minute to install here): skipped where it is missing."""
    pytest.importorskip("lightning")
    script = SCRIPT.with_name("lightning_job.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTDOCTOR_", "TORCHELASTIC_", "TORCH_FR_"))}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
    result = subprocess.run([sys.executable, "-m", "distdoctor", "guard", "--hang-timeout", str(HANG_TIMEOUT),
                             "--report-dir", str(tmp_path), "--", sys.executable, str(script), "8"], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400,
                            start_new_session=True)
    out = result.stdout
    assert result.returncode == 0, out[-6000:]
    assert "rank 0 done" in out and "rank 1 done" in out
    assert re.search(r"job\.E002 \[straggler_rank\] Rank 1 has not arrived at all_reduce #\d+ .*: at "
                     rf"`time\.sleep\(SLOW_S\)  # LINE:slow` at {re.escape(line_of(script, 'slow'))}", out), out[-6000:]
    assert re.search(r"rank 1 arrived after [\d.]+ s .*; stall 1 is over", out) and "the guard ends the job" not in out
    [stall] = json.loads((tmp_path / "stalls.json").read_text())
    assert stall["late_rank"] == 1 and 7.5 <= stall["seconds"] <= 8 + 4
