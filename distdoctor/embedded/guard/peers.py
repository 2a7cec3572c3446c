"""A rank that left nothing in the store: what this host can still tell about its process."""

# Every guarded rank publishes `hello/<rank>` = {host, pid} when the guard starts. A rank that
# neither answers nor left a final snapshot died without running Python (a signal, a crash in
# C/C++) or is frozen. When its process is on this host, /proc says which: gone, a zombie the
# launcher has not reaped yet (its exit status is still readable: field 52 of /proc/PID/stat,
# Linux >= 3.5), stopped (SIGSTOP), or alive and silent (the GIL held, a deadlock).

from __future__ import annotations

import os
import signal
import socket
from typing import Any

from distdoctor.diagnosis.snapshot import EXITED, KILLED, RUNNING, UNREACHABLE, RankSnapshot


def _proc_stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return text[text.rfind(")") + 2:].split()


def process_state(pid: int) -> tuple[str, int | None]:
    """('gone' | 'zombie' | 'stopped' | 'alive' | 'unknown', the wait status of a zombie)."""
    fields = _proc_stat(pid)
    if fields is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "gone", None
        except OSError:
            return "unknown", None
        return "unknown", None
    state = fields[0] if fields else "?"
    if state == "Z":
        # Fields from the 3rd on: exit_code is field 52, index 49 here; absent on old kernels.
        status = int(fields[49]) if len(fields) > 49 and fields[49].lstrip("-").isdigit() else None
        return "zombie", status
    return ("stopped" if state in ("T", "t") else "alive"), None


def absent_snapshot(rank: int, hello: Any, answer_s: float, asked: bool = True) -> RankSnapshot:
    """The snapshot of a rank that left no final state (and, ``asked``, did not answer within answer_s)."""
    host = str(hello.get("host", "")) if isinstance(hello, dict) else ""
    pid = hello.get("pid") if isinstance(hello, dict) and isinstance(hello.get("pid"), int) else None
    silent = f"did not answer within {answer_s:.1f} s and left no final state"
    if pid is None or host != socket.gethostname():
        where = f" (pid {pid} on {host})" if pid is not None and host else ""
        return RankSnapshot(rank=rank, host=host, pid=pid, status=UNREACHABLE, source="guard",
                            notes=(f"{silent}{where}: it died or is frozen",))
    state, status = process_state(pid)
    if state == "alive" and not asked:
        return RankSnapshot(rank=rank, host=host, pid=pid, status=RUNNING, source="guard",
                            notes=(f"its process (pid {pid} on this host) is alive and left no final state",))
    if state == "zombie" and status is not None:
        if os.WIFSIGNALED(status):
            code = -os.WTERMSIG(status)
            return RankSnapshot(rank=rank, host=host, pid=pid, status=KILLED, exit_code=code, source="guard",
                                notes=(f"its process (pid {pid}) ended by {signal.Signals(-code).name}",))
        return RankSnapshot(rank=rank, host=host, pid=pid, status=EXITED, exit_code=os.WEXITSTATUS(status),
                            source="guard", notes=(f"its process (pid {pid}) exited without a final state",))
    if state == "gone":  # ended (how: the launcher reaped it before anyone read it), not merely silent
        return RankSnapshot(rank=rank, host=host, pid=pid, status=EXITED, source="guard",
                            notes=(f"its process (pid {pid} on this host) is gone without an exception or a clean "
                                   "exit: killed by a signal (SIGKILL: the out-of-memory killer?) or a crash in C/C++",))
    notes = {
        "zombie": f"its process (pid {pid} on this host) has ended",
        "stopped": f"its process (pid {pid} on this host) is stopped (SIGSTOP / SIGTSTP)",
        "alive": f"its process (pid {pid} on this host) is alive but {silent}: frozen (a C extension holding "
                 "the GIL, a deadlock)",
    }
    return RankSnapshot(rank=rank, host=host, pid=pid, status=UNREACHABLE, source="guard",
                        notes=(notes.get(state, f"{silent} (pid {pid} on this host)"),))
