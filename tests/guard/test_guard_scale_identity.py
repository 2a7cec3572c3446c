"""A silent rank's process is read from /proc only when /proc here shows its processes: the same boot and
PID namespace. Made for real: a rank in a second PID namespace on this host (same host name, as pods with
hostNetwork or `docker run --network host` are), a PID reused by a later process, /proc that does not show it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from distdoctor.diagnosis.diagnose import diagnose
from distdoctor.diagnosis.snapshot import EXITED, NOT_HEARD, RUNNING, GroupProgress, PendingOp, RankSnapshot
from distdoctor.embedded.guard import peers
from distdoctor.embedded.guard.peers import absent_snapshot, process_state
from distdoctor.machine.proc_stat import identity, pid_namespace, process_stat

IDENTITY = ("import json, sys, time; from distdoctor.machine.proc_stat import identity; "
            "print(json.dumps(identity()), flush=True); time.sleep(60)")


def in_new_pid_namespace():
    """A guarded rank's hello, published from a process in a PID namespace of its own on this host."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to make a PID namespace")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", IDENTITY],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.skip(f"unshare could not make a PID namespace here: {proc.stderr.read()[-300:]}")
    return proc, json.loads(line)


def waiting(rank: int) -> RankSnapshot:
    pending = PendingOp("all_reduce", 9, ((165,),), ("Float",), "scheduled", 30.0)
    return RankSnapshot(rank, status=RUNNING, groups=(GroupProgress("0", (0, 1), 9, 8, pending),), source="guard")


def test_a_rank_in_another_pid_namespace_with_the_same_host_name_is_not_seen_from_here_never_gone():
    proc, hello = in_new_pid_namespace()
    try:
        assert hello["host"] == identity()["host"] and hello["boot"] == identity()["boot"]
        assert hello["pidns"] != pid_namespace() and hello["pid"] <= 3  # its own PID namespace: it is pid 1 or so
        # Here, its pid names another process (pid 1: this host's init) or none at all: /proc would say
        # "alive" or "gone" about the wrong process. The guard does not read it.
        snap = absent_snapshot(1, hello, 3.0)
        assert snap.status == NOT_HEARD and "not seen from here" in snap.notes[0], snap
        [finding] = diagnose([waiting(0), snap])
        assert finding.id == "job.W010" and finding.ranks == (1,)  # said, never named missing or ended
        # Its process from outside (this namespace's pid for it), with its start time: seen, alive.
        outer = int(subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()[0])
        same = {**identity(), "pid": outer, "start": process_stat(outer).start}
        assert process_state(outer, same["start"]) == ("alive", None)
        assert absent_snapshot(1, same, 3.0, asked=False).status == RUNNING
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_reused_pid_is_the_process_gone_not_the_newcomer_alive():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        hello = {**identity(), "pid": child.pid, "start": process_stat(child.pid).start - 1}  # started earlier
        snap = absent_snapshot(1, hello, 3.0)
        assert snap.status == EXITED and "is gone" in snap.notes[0]  # the pid now names a later process
    finally:
        child.kill()
        child.wait()


def test_a_process_proc_does_not_show_is_not_heard_from(monkeypatch):
    # /proc mounted with hidepid, or not at all: the pid exists (kill(pid, 0) succeeds) but has no entry.
    monkeypatch.setattr(peers, "process_stat", lambda pid: None)
    snap = absent_snapshot(1, {**identity(), "pid": os.getpid(), "start": None}, 3.0)
    assert snap.status == NOT_HEARD and "not readable" in snap.notes[0]
    # No boot id or PID namespace published (an older guard, a platform without them): nothing is read.
    bare = absent_snapshot(1, {"host": identity()["host"], "pid": os.getpid()}, 3.0)
    assert bare.status == NOT_HEARD and "not seen from here" in bare.notes[0]
