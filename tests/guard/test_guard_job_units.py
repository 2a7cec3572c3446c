"""The guard's view of the whole job without a process group: the flight recorder's stall clock and
settings, a silent rank's process read from /proc, an exception turned into a snapshot, the hook chain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace


from distdoctor.diagnosis.snapshot import EXITED, KILLED, NOT_HEARD, RUNNING, UNREACHABLE
from distdoctor.embedded.guard.crash import CrashHook
from distdoctor.embedded.guard.flight import FlightRecorder, buffer_setting, launch_environment
from distdoctor.embedded.guard.peers import absent_snapshot, process_state
from distdoctor.embedded.guard.snapshot import is_consequence, raised_error
from distdoctor.machine.proc_stat import identity, process_stat


def test_the_launch_sets_the_buffer_when_unset_and_a_garbage_value_is_turned_off_and_named():
    env: dict[str, str] = {}
    assert launch_environment(env) == "" and env["TORCH_FR_BUFFER_SIZE"] == "2000"
    env = {"TORCH_FR_BUFFER_SIZE": "64"}
    assert launch_environment(env) == "" and env["TORCH_FR_BUFFER_SIZE"] == "64"
    env = {"TORCH_FR_BUFFER_SIZE": "lots"}
    note = launch_environment(env)
    assert env["TORCH_FR_BUFFER_SIZE"] == "0" and "'lots' is not an integer" in note
    assert buffer_setting({"TORCH_NCCL_TRACE_BUFFER_SIZE": "10"}) == ("TORCH_NCCL_TRACE_BUFFER_SIZE", 10)


def fake_c10d(status: dict, entries: list | None = None, fail: bool = False):
    def dump(includeCollectives=True, onlyActive=False):
        if fail:
            raise RuntimeError("recorder broke")
        out = {"version": "2.10", "pg_status": status, "pg_config": {}}
        if includeCollectives:
            out["entries"] = entries or []
        return json.dumps(out).encode()
    return SimpleNamespace(_dump_fr_trace_json=dump)


def test_the_recorder_reports_what_it_cannot_count_instead_of_raising():
    assert FlightRecorder(SimpleNamespace(), {}).problem.startswith("this torch has no flight recorder")
    assert "turns torch's flight recorder off" in FlightRecorder(fake_c10d({}), {"TORCH_FR_BUFFER_SIZE": "0"}).problem
    broken = FlightRecorder(fake_c10d({}, fail=True), {})
    assert broken.usable and broken.status() == {} and "recorder broke" in broken.problem and not broken.usable
    fr = FlightRecorder(fake_c10d({"0": {"last_enqueued_collective": "9", "last_completed_collective": "8"}},
                                  [{"collective_seq_id": 9, "profiling_name": "gloo:all_reduce", "input_sizes": [[165]],
                                    "input_dtypes": ["Float"], "state": "scheduled", "process_group": ["0", "default_pg"],
                                    "time_created_ns": time.time_ns() - 5_000_000_000}]), {})
    assert fr.status() == {"0": (9, 8)}
    [group] = fr.groups()
    assert group.pending.describe() == "all_reduce #9 (Float[165])" and group.pending.age_s >= 4.9


def hello_of(pid: int) -> dict:
    """The hello a guarded process ``pid`` of this host, boot and PID namespace publishes."""
    return {**identity(), "pid": pid, "start": process_stat(pid).start}


def test_a_silent_rank_on_this_host_is_read_from_proc():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        hello = hello_of(child.pid)
        assert process_state(child.pid) == ("alive", None)
        assert absent_snapshot(1, hello, 1.5, asked=False).status == RUNNING
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(0.2)
        stopped = absent_snapshot(1, hello, 1.5)
        assert stopped.status == UNREACHABLE and "stopped" in stopped.notes[0]
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while process_state(child.pid)[0] != "zombie" and time.monotonic() < deadline:
            time.sleep(0.05)
        killed = absent_snapshot(1, hello, 1.5)  # not reaped yet: its wait status is still there
        assert (killed.status, killed.exit_code) == (KILLED, -9), killed
    finally:
        child.kill()
        child.wait()
    gone = absent_snapshot(1, hello, 1.5)
    assert gone.status == EXITED and gone.exit_code is None and "is gone" in gone.notes[0]  # ended, not silent
    elsewhere = absent_snapshot(2, {"host": "node-b", "pid": 4}, 1.5)
    assert elsewhere.status == NOT_HEARD and "node-b" in elsewhere.notes[0] and "not seen from here" in elsewhere.notes[0]


def test_a_clean_exit_of_a_silent_rank_keeps_its_code():
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    deadline = time.monotonic() + 20
    while process_state(child.pid)[0] != "zombie" and time.monotonic() < deadline:
        time.sleep(0.05)
    snap = absent_snapshot(1, hello_of(child.pid), 1.5)
    child.wait()
    assert (snap.status, snap.exit_code) == (EXITED, 3)


def test_an_exception_becomes_a_raised_error_at_the_users_line_and_a_peers_failure_a_consequence():
    def load_batch():
        raise ValueError("bad batch at step 3")
    try:
        load_batch()
    except ValueError as exc:
        error = raised_error(exc, exc.__traceback__)
    assert (error.type, error.message, error.consequence) == ("ValueError", "bad batch at step 3", False)
    assert error.frame.file.endswith("test_guard_job_units.py") and error.frame.code == 'raise ValueError("bad batch at step 3")'
    closed = RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:7554. This is")
    assert is_consequence(closed) and not is_consequence(ValueError("Connection"))


def test_the_hook_runs_before_the_users_hook_and_the_users_hook_still_runs(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *a: seen.append("user"))
    guard = SimpleNamespace(concluded=False, final_left=False)
    hook = CrashHook(guard)
    hook.on_exception = lambda exc, tb: seen.append("guard")
    hook.install()
    try:
        sys.excepthook(ValueError, ValueError("x"), None)
        hook.on_exception = lambda exc, tb: 1 / 0  # a fault of the guard's own never hides the traceback
        sys.excepthook(ValueError, ValueError("x"), None)
    finally:
        hook.uninstall()
    assert seen == ["guard", "user", "user"]
    assert not getattr(sys.excepthook, "__distdoctor_guard__", False)


def test_init_process_group_with_the_guard_sets_the_buffer_in_this_process_unless_the_user_did(monkeypatch):
    from distdoctor.embedded.guard.flight import prepare_this_process

    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "DISTDOCTOR_GUARD_FR_NOTE"):
        monkeypatch.delenv(name, raising=False)
    prepare_this_process()
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == "2000" and "DISTDOCTOR_GUARD_FR_NOTE" not in os.environ
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "x")
    prepare_this_process()
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == "0" and "'x' is not an integer" in os.environ["DISTDOCTOR_GUARD_FR_NOTE"]
