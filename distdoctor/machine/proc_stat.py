"""A process as /proc tells it: its stat line (state, start, a zombie's exit status) and which kernel and PID namespace it is in."""

# The one reader of /proc/<pid>/stat: `distdoctor stacks` (a rank's state and clock), the guard (a
# silent peer's process) and machine.thread_clock (one thread's counters) all parse it here.
# A PID names a process only inside one PID namespace of one boot of one kernel: two containers on
# one host (Kubernetes hostNetwork pods, `docker run --network host`) share the host name but not
# their PIDs, and a PID is reused once its process is reaped. So a process is identified by
# (boot id, PID namespace, pid, start time), and /proc is asked about another process only when
# the boot id and PID namespace are this process's own.

from __future__ import annotations

import os
from typing import NamedTuple

# Fields of /proc/<pid>/stat counted from 1 (man 5 proc): 3 state, 22 starttime, 52 exit_code.
_STATE, _START, _EXIT = 3, 22, 52
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def stat_fields(path: str) -> list[str] | None:
    """A /proc stat file's fields after the name (field 2 may hold spaces and ')'), so field N is
    at index N - 3; None when unreadable."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            text = fh.read()
        return text[text.rindex(")") + 2:].split()
    except (OSError, ValueError):
        return None


class ProcStat(NamedTuple):
    """What /proc/<pid>/stat says of a process: its state letter, its start (clock ticks after boot;
    a reused PID starts later) and, for a zombie, its wait status (Linux >= 3.5)."""

    state: str
    start: int | None = None
    exit_status: int | None = None


def _field(fields: list[str], number: int) -> int | None:
    try:
        return int(fields[number - 3])
    except (IndexError, ValueError):
        return None


def process_stat(pid: int | str) -> ProcStat | None:
    """The stat of process ``pid`` ("self" for this one); None when /proc has no such entry."""
    fields = stat_fields(f"/proc/{pid}/stat")
    if not fields:
        return None
    state = fields[0][:1]
    return ProcStat(state, _field(fields, _START), _field(fields, _EXIT) if state == "Z" else None)


def boot_id() -> str:
    """This kernel's boot id ('' when /proc does not say): two processes with the same one run on
    one boot of one kernel."""
    try:
        with open(_BOOT_ID, encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def pid_namespace(pid: int | str = "self") -> int | None:
    """The inode of the PID namespace ``pid`` is in (None when /proc does not say): equal inodes on
    one boot are one namespace, so its PIDs mean the same processes."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def identity() -> dict[str, object]:
    """This process as another process on any host can check it: host, boot id, PID namespace,
    pid and start (what the guard publishes in its hello)."""
    import socket  # only here: the rest of this module reads files

    own = process_stat("self")
    return {"host": socket.gethostname(), "boot": boot_id(), "pidns": pid_namespace(), "pid": os.getpid(),
            "start": own.start if own is not None else None}
