"""The guard's proof of "cannot finish" on real jobs (torchrun, gloo): a send dropped long before an
unrelated receive is a leak and the job finishes (its twin, the send received and waited on, says no
leak); a receive that takes a dropped send ends the job; a stall in a group whose traffic no socket
carries (a CPU stand-in for NCCL) is never proven stuck, and the job finishes. Each run is judged as it
first ran."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from guard_torchrun import launch, line_of

pytestmark = pytest.mark.multiproc
SCRIPT = Path(__file__).with_name("scripts") / "proof_job.py"


def run(tmp_path: Path, *args: str, hang_timeout: str = "3") -> tuple[int, str]:
    """One guarded torchrun of proof_job.py, launched once (no retry); (exit code, output)."""
    cmd = [sys.executable, "-m", "distdoctor", "guard", "--hang-timeout", hang_timeout, "--report-dir", str(tmp_path),
           "--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(SCRIPT), *args]
    result = launch(cmd, tmp_path, 150)
    return result.returncode, result.stdout


def stall_report(out: str) -> str:
    found = re.search(r"\[stall 1\]:\n.*?\ndistdoctor guard \(rank \d\): the guard (?:watches|ends the job)[^\n]*", out, re.S)
    assert found, out[-6000:]
    return found.group(0)


@pytest.mark.parametrize("mode", ["leak", "kept"])
def test_a_send_dropped_early_that_nobody_receives_is_a_leak_not_a_deadlock_and_the_job_finishes(tmp_path, mode):
    """The issue's job: rank 0's isend (tag 7) at step 1 is dropped and never received; at step 8 rank 1
    receives (tag 0) what rank 0 sends 8 s later. The stall is rank 0 at its pause, watched; the dropped
    send is a leak beside it (guard.W013), never guard.E009. Twin: the tag-7 send received and waited on."""
    code, out = run(tmp_path, mode, "8")
    assert code == 0 and "rank 0 done" in out and "rank 1 done" in out, out[-6000:]
    assert "the guard ends the job" not in out
    report = stall_report(out)
    assert re.search(rf"job\.E002 \[straggler_rank\] Rank 0 has not arrived at recv from rank 0 .*at "
                     rf"`time\.sleep\(pause\)  # LINE:pause` at {re.escape(line_of(SCRIPT, 'pause'))}", report), report
    assert "the guard watches: a rank that may still arrive is outside the collective" in report
    assert "guard.E009 [collective_timeout_hang] Rank 0 dropped" not in out
    leak = re.search(r"guard\.W013 \[collective_timeout_hang\] Rank 0 dropped isend #0 to rank 1 \(tag 7\) at "
                     rf"{re.escape(line_of(SCRIPT, 'dropped'))}, [\d.]+ s ago; no receive waits for it", report)
    assert bool(leak) == (mode == "leak"), report
    assert ("guard.W013" in out) == (mode == "leak")


def test_a_receive_that_takes_a_dropped_send_is_guard_e009_and_the_job_ends(tmp_path):
    """Rank 0 drops an isend before rank 1 posts the receive that takes it (same group, peers, tag and
    place): on gloo that send never arrives. Rank 0 then sleeps outside any collective, so only the
    pairing proves that the job cannot finish."""
    code, out = run(tmp_path, "matched")
    assert code != 0 and "rank 1 done" not in out, out[-6000:]
    assert (f"guard.E009 [collective_timeout_hang] Rank 0 dropped isend #0 to rank 1 at {line_of(SCRIPT, 'matched')} "
            "without wait(); rank 1 waits in recv #0 from rank 0 for it") in out, out[-6000:]
    assert "the guard ends the job: no rank can advance (guard.E009 [collective_timeout_hang])" in out
    assert "guard.W013" not in out


def test_a_stall_in_a_group_whose_traffic_no_socket_carries_is_never_proven_stuck_and_the_job_finishes(tmp_path):
    """A gloo default group, idle, and a second group on a backend whose traffic is on no socket the guard
    reads (its all_reduce takes 8 s): the proof is read from the stalled group's own backend, which cannot
    say, so the stall is watched (job.E009 not proven), never ended; the default group's idle sockets prove
    nothing about it."""
    code, out = run(tmp_path, "standin", "8")
    assert code == 0 and "rank 0 done" in out and "rank 1 done" in out, out[-6000:]
    report = stall_report(out)
    assert "job.E009 [collective_timeout_hang] Every rank waits in all_reduce (float32[4]) of group 1" in report, report
    assert "backend storegroup: whether its collectives move data over connections this guard reads is not known" in report
    assert "nothing moves" not in out and "the guard ends the job" not in out
    assert "the guard watches: every rank is in the collective, but that it no longer moves data is not proven" in report
    assert re.search(r"stall 1 cleared after [\d.]+ s \(all_reduce of group 1\)", out), out[-3000:]
