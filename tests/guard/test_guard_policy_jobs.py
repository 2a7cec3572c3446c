"""The policy on real jobs (torchrun, gloo): a straggler arriving in the last seconds before the group's
timeout finishes, an evaluation longer than the group's timeout ends when torch ends it and is reported
with the guard's diagnosis, a caught error's final does not outlive it, a rank stopped past the hang
timeout is watched and cleared, a store that answers slowly ends nothing."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from guard_torchrun import LAUNCHER_VARS, REPO, guarded_run, line_of, reports

from distdoctor.embedded.guard import policy

pytestmark = pytest.mark.multiproc
SCRIPT = Path(__file__).with_name("scripts") / "policy_job.py"


def line(tag: str) -> str:
    return line_of(SCRIPT, tag)


def stall_reports(out: str) -> list[str]:
    """Each stall report printed (its heading to the line that says what happens next)."""
    return re.findall(r"\[stall \d+\]:\n.*?\ndistdoctor guard \(rank \d\): the guard (?:watches|ends the job)", out, re.S)


def test_a_straggler_arriving_in_the_last_seconds_before_the_groups_timeout_finishes(tmp_path):
    """Group timeout 20 s, rank 1 arrives 18 s late: plain torch finishes; so must the guarded job (the
    guard used to end it up to 60 s, here 3 s, before the group's timeout: at about 17.5 s). Reported
    as a warning."""
    result, _ = guarded_run(SCRIPT, ["lastminute", "20", "18"], tmp_path, "--hang-timeout", "3", timeout=180)
    out = result.stdout
    assert result.returncode == 0, out[-6000:]
    assert "rank 0 done" in out and "rank 1 done" in out and "the guard ends the job" not in out
    [report] = stall_reports(out)
    assert re.search(rf"job\.E002 \[straggler_rank\] Rank 1 has not arrived at all_reduce #\d+ .*at "
                     rf"`time\.sleep\(late_s\)  # LINE:late` at {re.escape(line('late'))}", report), report
    assert "Warnings (1)" in report and "Errors (" not in report  # watched: the job goes on
    deadline = re.search(r"the guard ends it only if the stall lasts the process group's own timeout \(20 s; (\d+) s "
                         r"from now\)", out)
    # The group's timeout and gloo's grace (policy.grace_s) from the stall's start, which was 3-5 s ago.
    assert deadline and 15 <= int(deadline.group(1)) <= 20 + policy.grace_s("gloo"), out[-3000:]
    assert re.search(r"rank 1 arrived after 1[789]\.\d s \(all_reduce #\d+ of the default group\); stall 1 is over", out)
    [hang] = reports(tmp_path, "hang")
    assert [(f["id"], f["severity"]) for f in hang["findings"]] == [("job.E002", "warning")] and hang["status"] == "warning"
    [stall] = json.loads((tmp_path / "stalls.json").read_text())
    assert stall["action"] == "watch" and stall["severity"] == "warning" and 17.5 <= stall["seconds"] <= 21


def plain_run(args: list[str], cwd: Path) -> tuple[subprocess.Popen, float]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith(("DISTDOCTOR_", "TORCH"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT), *args]
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True), time.monotonic()


def test_an_evaluation_longer_than_the_groups_timeout_ends_when_torch_ends_it_with_the_guards_diagnosis(tmp_path):
    """Rank 0 evaluates for 40 s, the group's timeout is 10 s. Plain torch: rank 1's all_reduce raises
    gloo's "Timed out waiting 10000ms" and the job fails. Guarded: the same end, no earlier, and the
    report names rank 0 at its evaluation line (a warning while watched, an error at the end)."""
    plain, started = plain_run(["evaluate", "10", "40"], tmp_path)
    try:
        result, took = guarded_run(SCRIPT, ["evaluate", "10", "40"], tmp_path, "--hang-timeout", "3", timeout=180)
        torch_out, _ = plain.communicate(timeout=120)
    finally:
        if plain.poll() is None:
            os.killpg(plain.pid, signal.SIGKILL)
    # Plain torch ends it with its timeout: gloo's recv ("Timed out waiting 10000ms for recv operation"), or on a
    # machine so loaded that the start-up itself outlasts the 10 s (the same timeout bounds the store's waits)
    # with the store's ("Socket Timeout", "timed out after 10000ms").
    assert plain.returncode != 0 and re.search(r"Timed out waiting 10000ms|timed out after 10000ms|Socket Timeout",
                                               torch_out), torch_out[-3000:]
    out = result.stdout
    assert result.returncode != 0 and "rank 0 done" not in out, out[-6000:]
    [watched] = stall_reports(out)[:1]
    assert "job.E002 [straggler_rank] Rank 0 has not arrived" in watched and "Warnings (1)" in watched
    # What ended the job: torch's timeout (rank 1's exception hook) or the guard at that same timeout.
    ended = reports(tmp_path, "exception") + [r for r in reports(tmp_path, "hang") if r["status"] == "error"]
    assert ended, out[-6000:]
    first = ended[0]["findings"][0]
    assert (first["id"], first["severity"], first["ranks"]) == ("job.E002", "error", [0]), first["title"]
    assert f"`time.sleep(seconds)  # LINE:evaluate` at {line('evaluate')}" in first["title"]
    if reports(tmp_path, "exception"):
        assert "Timed out waiting 10000ms" in first["detail"]  # torch's own end, as the consequence
    [stall] = json.loads((tmp_path / "stalls.json").read_text())
    assert stall["severity"] == "error" and stall["late_rank"] == 0 and stall["seconds"] >= 9, stall
    # No earlier than torch: the stall began about 3 steps in; the job ran at least the group's timeout.
    assert took >= 10 and "the guard ends it only if the stall lasts the process group's own timeout (10 s;" in out


def test_an_error_the_users_code_catches_does_not_leave_a_stale_final_state(tmp_path):
    """Rank 1's all_reduce in a group rank 0 never joins times out and the guard explains it (its final
    state left for the peers); rank 1 catches the error and trains on. Later rank 1 is 10 s late: it is
    the straggler at its line (watched, the job finishes), not a rank that raised."""
    result, _ = guarded_run(SCRIPT, ["caught", "10"], tmp_path, "--hang-timeout", "6", timeout=180)
    out = result.stdout
    assert "rank 1 caught GuardError" in out, out[-6000:]
    assert result.returncode == 0 and "rank 0 done" in out and "rank 1 done" in out, out[-6000:]
    reported = stall_reports(out)
    assert reported and all("the guard ends the job" not in r for r in reported)
    assert re.search(rf"job\.E002 \[straggler_rank\] Rank 1 has not arrived at all_reduce #\d+ .*at "
                     rf"`time\.sleep\(late_s\)  # LINE:late` at {re.escape(line('late'))}", reported[-1]), reported[-1]


def test_a_rank_stopped_past_the_hang_timeout_is_watched_and_cleared_when_it_continues(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    box: dict = {}

    def run() -> None:
        box["result"] = guarded_run(SCRIPT, ["steps", "80", str(pids)], tmp_path, "--hang-timeout", "3", timeout=180)

    job = threading.Thread(target=run)
    job.start()
    deadline = time.monotonic() + 120
    while len([p for p in pids.glob("rank*") if p.read_text().strip()]) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    pid = int((pids / "rank1").read_text())
    time.sleep(2.0)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(9.0)  # three hang timeouts
    finally:
        os.kill(pid, signal.SIGCONT)
    job.join(timeout=200)
    result, _ = box["result"]
    out = result.stdout
    assert result.returncode == 0 and "rank 0 done" in out and "rank 1 done" in out, out[-6000:]
    [report] = stall_reports(out)
    assert "the guard watches" in report and "Warnings (" in report and "Errors (" not in report, report
    assert re.search(r"job\.E004 \[rank_missing\] Rank 1 did not answer", report), report
    assert re.search(r"rank 1 arrived after ([\d.]+) s .*; stall 1 is over", out), out[-3000:]


class SlowProxy:
    """A TCP proxy that holds every chunk ``delay_s`` before passing it on: a store that answers slowly."""

    def __init__(self, target_port: int, delay_s: float) -> None:
        self.target, self.delay_s = target_port, delay_s
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                continue
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        """Reach the store for this client; rank 1 may knock before rank 0's store listens."""
        until = time.monotonic() + 60
        while True:
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
                break
            except OSError:
                if time.monotonic() > until or self.closed:
                    client.close()
                    return
                time.sleep(0.1)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(1 << 16):
                time.sleep(self.delay_s)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.server.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("late_s", [0.0, 15.0], ids=["healthy", "straggler"])
def test_a_store_that_answers_slowly_ends_nothing(tmp_path, late_s):
    """Rank 1 reaches the store (torch's client and the guard's) through a proxy that holds every
    chunk 0.1 s (0.2 s a request). Healthy: the guard says nothing. Rank 0 15 s late: not ended."""
    port = free_port()
    proxy = SlowProxy(port, 0.1)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith(("DISTDOCTOR_", "TORCH"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), WORLD_SIZE="2", HANG_TIMEOUT="6", TORCH_FR_BUFFER_SIZE="2000")
    logs = [tmp_path / f"rank{r}.out" for r in (0, 1)]
    procs = []
    for r in (0, 1):
        with open(logs[r], "w") as log:
            procs.append(subprocess.Popen([sys.executable, str(SCRIPT), "slowstore", str(late_s), str(proxy.port)],
                                          env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, cwd=tmp_path, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + 150
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail("the job did not end within 150 s:\n" + "\n".join(log.read_text()[-3000:] for log in logs))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        proxy.close()
    out = "\n".join(log.read_text() for log in logs)
    assert [p.returncode for p in procs] == [0, 0], out[-6000:]
    assert "rank 0 done" in out and "rank 1 done" in out and "the guard ends the job" not in out
    if not late_s:
        assert "distdoctor guard (rank" not in out, out[-3000:]
