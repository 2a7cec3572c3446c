"""Whether a rank's process runs, is a zombie (with its exit status) or is gone, from /proc only."""

# A zombie's exit status is readable by anyone who may read /proc/PID/stat: its 52nd field is
# the status in waitpid's form (Linux >= 3.5), so a rank that died but was not yet reaped by its
# launcher (torchrun polls its workers every --monitor-interval seconds) is named with its code
# or signal without waiting on it (only the parent may, and that would reap it under its feet).

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import psutil

from distdoctor.diagnosis.snapshot import EXITED, KILLED, RUNNING, UNKNOWN
from distdoctor.machine.proc_stat import process_stat, stat_fields
from distdoctor.machine.thread_clock import TICKS, read_thread


@dataclass(frozen=True)
class ProcState:
    status: str                    # a diagnosis.snapshot status
    exit_code: int | None = None   # the code, or minus the signal number
    note: str = ""


def _exit_status(pid: int) -> int | None:
    """The waitpid status a zombie left in /proc/PID/stat, or None."""
    stat = process_stat(pid)
    return stat.exit_status if stat is not None else None


def decode_wait_status(status: int) -> tuple[str, int]:
    """waitpid status -> (EXITED, code) or (KILLED, -signal)."""
    if os.WIFSIGNALED(status):
        return KILLED, -os.WTERMSIG(status)
    return EXITED, os.WEXITSTATUS(status)


def _signal_text(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def read_state(pid: int) -> ProcState:
    """running / a zombie's exit / gone; never raises."""
    try:
        status = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return ProcState(EXITED, None, "its process is gone (reaped by its launcher: the exit status was not seen)")
    except psutil.Error as exc:
        return ProcState(UNKNOWN, None, f"its state is not readable: {exc}")
    if status == psutil.STATUS_ZOMBIE:
        raw = _exit_status(pid)
        if raw is None:
            return ProcState(EXITED, None, "a zombie (ended, not yet reaped by its launcher); exit status not readable")
        state, code = decode_wait_status(raw)
        how = f"killed by {_signal_text(code)}" if state == KILLED else f"exited with code {code}"
        return ProcState(state, code, f"a zombie: it {how} and its launcher has not reaped it yet")
    if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
        return ProcState(RUNNING, None, f"its process is {status} (SIGSTOP, or a debugger holds it)")
    if status == psutil.STATUS_DEAD:
        return ProcState(EXITED, None, "its process is ending")
    return ProcState(RUNNING)


# Mapped into a process that drives a GPU: the device files, the CUDA driver, ROCm's runtime.
_GPU_MAPS = ("/dev/nvidia", "libcuda.so", "/dev/kfd", "libamdhip64.so", "/dev/accel")


@dataclass(frozen=True)
class Clock:
    """A process's time as /proc tells it, read between two stack dumps."""

    state: str = ""                    # its main thread's kernel state: R, S, D, T, Z ...
    cpu_s: float | None = None         # CPU seconds its main thread has used (schedstat: ns)
    process_cpu_s: float | None = None # CPU seconds all its threads have used
    start: int | None = None           # when it started, in clock ticks after boot (a reused PID differs)


def read_clock(pid: int) -> Clock:
    """The main thread's state and CPU time, the process's CPU time and start; never raises
    (what cannot be read stays empty)."""
    process = stat_fields(f"/proc/{pid}/stat")
    if process is None or len(process) < 20:
        return Clock()
    try:
        process_cpu = (int(process[11]) + int(process[12])) / TICKS
        start = int(process[19])
    except ValueError:
        return Clock(state=process[0][:1])
    thread = read_thread(f"/proc/{pid}/task/{pid}")
    return Clock(state=thread.state or process[0][:1], cpu_s=thread.cpu_s if thread.cpu_s is not None else process_cpu,
                 process_cpu_s=process_cpu, start=start)


def uses_gpu(pid: int) -> bool | None:
    """Whether the process has a GPU's device files or driver mapped (None: not readable)."""
    try:
        # One read and one search per name (a torch process maps ~2,700 regions: a scan line by
        # line in Python cost 28 ms a rank, 1.8 s for 64 ranks on the sampler's main thread).
        with open(f"/proc/{pid}/maps", "rb") as fh:
            maps = fh.read()
    except OSError:
        return None
    return any(name.encode() in maps for name in _GPU_MAPS)
