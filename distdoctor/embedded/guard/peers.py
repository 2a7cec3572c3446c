"""A rank that left nothing in the store: what this host can prove about its process, else "not heard from"."""

# Every guarded rank publishes `hello/<rank>` when the guard starts: host, boot id, PID namespace
# (machine.proc_stat.identity), pid and start time. A rank that neither answers a look in time nor
# left a final snapshot is *not heard from*: slow to answer, frozen, dead or elsewhere, and a
# verdict never names it for that alone. Only positive evidence names it: its process read from
# /proc, and only when /proc here shows the same processes it saw (the same boot id and PID
# namespace; a container on the same host that shares the host name but not the PID namespace is
# "not seen from here", never "gone"). Then /proc says: gone (or its PID reused by a later
# process: another start time), a zombie the launcher has not reaped (its exit status, field 52),
# stopped (SIGSTOP), or alive, which proves nothing more than that it was not heard from.

from __future__ import annotations

import os
import signal
from typing import Any

from distdoctor.diagnosis.snapshot import EXITED, KILLED, NOT_HEARD, RUNNING, UNREACHABLE, RankSnapshot
from distdoctor.machine.proc_stat import boot_id, pid_namespace, process_stat

_OWN: dict[str, Any] = {}


def _own_namespace() -> tuple[str, int | None]:
    """(boot id, PID namespace inode) of this process, read once."""
    if not _OWN:
        _OWN.update(boot=boot_id(), pidns=pid_namespace())
    return _OWN["boot"], _OWN["pidns"]


def seen_from_here(hello: Any) -> bool:
    """Whether /proc here shows the processes the rank that said ``hello`` saw: the same boot of the
    same kernel and the same PID namespace (both published, both equal to this process's)."""
    if not isinstance(hello, dict):
        return False
    boot, pidns = _own_namespace()
    return bool(boot) and pidns is not None and hello.get("boot") == boot and hello.get("pidns") == pidns


def process_state(pid: int, start: int | None = None) -> tuple[str, int | None]:
    """('gone' | 'zombie' | 'stopped' | 'alive' | 'unknown', the wait status of a zombie) of process
    ``pid`` in this PID namespace; ``start``: its start time as it published it (a PID now held by a
    process that started at another time was reused: the one asked about is gone)."""
    stat = process_stat(pid)
    if stat is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "gone", None
        except OSError:
            return "unknown", None
        return "unknown", None  # it exists but /proc does not show it (hidepid): nothing proven
    if start is not None and stat.start is not None and stat.start != start:
        return "gone", None
    if stat.state == "Z":
        return "zombie", stat.exit_status
    return ("stopped" if stat.state in ("T", "t") else "alive"), None


def not_heard(rank: int, hello: Any, why: str, last: str = "") -> RankSnapshot:
    """A rank nothing was heard from in time: what it published last, nothing claimed about it."""
    host = str(hello.get("host", "")) if isinstance(hello, dict) else ""
    pid = hello.get("pid") if isinstance(hello, dict) and isinstance(hello.get("pid"), int) else None
    return RankSnapshot(rank=rank, host=host, pid=pid, status=NOT_HEARD, source="guard",
                        notes=tuple(n for n in (why, last) if n))


def absent_snapshot(rank: int, hello: Any, waited_s: float, asked: bool = True, last: str = "") -> RankSnapshot:
    """The snapshot of a rank that left no final state and (``asked``) did not answer within waited_s:
    what /proc proves about its process when it is provably in this PID namespace, else not heard
    from. ``last``: what it published last (its previous answer), said beside it."""
    silent = f"not heard from within {waited_s:.1f} s" if asked else "no final state"
    if not isinstance(hello, dict):
        return not_heard(rank, hello, f"{silent}; it published no hello (its guard may not have reached the store)", last)
    host, pid = str(hello.get("host", "")), hello.get("pid")
    if not isinstance(pid, int) or not seen_from_here(hello):
        where = f"pid {pid} on {host}" if isinstance(pid, int) and host else "its process"
        return not_heard(rank, hello, f"{silent}; {where} is not seen from here (another host, boot or PID namespace)",
                         last)
    start = hello.get("start") if isinstance(hello.get("start"), int) else None
    state, status = process_state(pid, start)
    if state == "zombie" and status is not None:
        if os.WIFSIGNALED(status):
            code = -os.WTERMSIG(status)
            return RankSnapshot(rank=rank, host=host, pid=pid, status=KILLED, exit_code=code, source="guard",
                                notes=(f"its process (pid {pid}) ended by {_signal_name(-code)}",))
        return RankSnapshot(rank=rank, host=host, pid=pid, status=EXITED, exit_code=os.WEXITSTATUS(status),
                            source="guard", notes=(f"its process (pid {pid}) exited without a final state",))
    if state == "zombie":
        return RankSnapshot(rank=rank, host=host, pid=pid, status=EXITED, source="guard",
                            notes=(f"its process (pid {pid} on this host) has ended (its exit status is not readable)",))
    if state == "gone":  # ended (how: the launcher reaped it before anyone read it), not merely silent
        return RankSnapshot(rank=rank, host=host, pid=pid, status=EXITED, source="guard",
                            notes=(f"its process (pid {pid} on this host) is gone without an exception or a clean "
                                   "exit: killed by a signal (SIGKILL: the out-of-memory killer?) or a crash in C/C++",))
    if state == "stopped":
        return RankSnapshot(rank=rank, host=host, pid=pid, status=UNREACHABLE, source="guard",
                            notes=(f"its process (pid {pid} on this host) is stopped (SIGSTOP / SIGTSTP)",))
    if state == "alive" and not asked:
        return RankSnapshot(rank=rank, host=host, pid=pid, status=RUNNING, source="guard",
                            notes=(f"its process (pid {pid} on this host) is alive and left no final state",))
    seen = "is alive" if state == "alive" else "is not readable in /proc (hidepid?)"
    return not_heard(rank, hello, f"{silent}; its process (pid {pid} on this host) {seen}", last)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
