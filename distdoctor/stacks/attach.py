"""Why py-spy may not read a process (owner, Yama's ptrace_scope, a container without SYS_PTRACE) and the fix for each."""

# Reading another process's memory needs ptrace access (PTRACE_MODE_ATTACH): the same user
# and Yama's ptrace_scope 0, or CAP_SYS_PTRACE (root outside a container). The reasons are
# checked in the order a user has to fix them; the first that applies is named with its fix.

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

from distdoctor.core.registry import finding_kind

PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
_CAP_SYS_PTRACE = 19

CANNOT_ATTACH = finding_kind(
    "stacks.E005", cause="unknown", title="py-spy may not read a rank's memory (ptrace is not allowed)",
    hint="Run `distdoctor stacks` as the job's user or as root; see the finding's fix for the setting that blocks it (ptrace_scope, a container without SYS_PTRACE)")


@dataclass(frozen=True)
class AttachProblem:
    reason: str   # other_user / ptrace_scope / no_cap_sys_ptrace / denied
    detail: str
    fix: str


def ptrace_scope() -> int | None:
    try:
        with open(PTRACE_SCOPE, encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None  # no Yama in this kernel: only the ordinary permission rules apply


def has_cap_sys_ptrace() -> bool | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_PTRACE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _owner(pid: int) -> tuple[int | None, str]:
    try:
        proc = psutil.Process(pid)
        return proc.uids().real, proc.username()
    except (psutil.Error, KeyError, OSError):
        return None, "?"


def explain_denied(pid: int) -> AttachProblem:
    """The reason ptrace was refused for this PID, and what to do."""
    uid, user = _owner(pid)
    me = os.geteuid()
    scope = ptrace_scope()
    cap = has_cap_sys_ptrace()
    rerun = 'sudo env "PATH=$PATH" distdoctor stacks ...'
    if uid is not None and uid != me and me != 0:
        return AttachProblem("other_user", f"process {pid} belongs to user {user} (uid {uid}); distdoctor runs as uid {me}",
                             f"run distdoctor as {user} (sudo -u {user} distdoctor stacks ...) or as root ({rerun})")
    if me == 0 and cap is False:
        return AttachProblem("no_cap_sys_ptrace", "distdoctor runs as root but without CAP_SYS_PTRACE: a container started without it",
                             "start the container with ptrace allowed: docker run --cap-add SYS_PTRACE ... "
                             "(Kubernetes: securityContext.capabilities.add: [\"SYS_PTRACE\"]), or run distdoctor on the host")
    if scope == 3:
        return AttachProblem("ptrace_scope", f"{PTRACE_SCOPE} is 3: no process may be ptraced until the next reboot",
                             "reboot with kernel.yama.ptrace_scope set lower in /etc/sysctl.d (it cannot be lowered at run time from 3)")
    if scope == 2 and me != 0:
        return AttachProblem("ptrace_scope", f"{PTRACE_SCOPE} is 2: only root (CAP_SYS_PTRACE) may ptrace",
                             f"run as root: {rerun}")
    if scope == 1 and me != 0:
        return AttachProblem("ptrace_scope", f"{PTRACE_SCOPE} is 1: a process may only ptrace its own descendants",
                             f"run as root ({rerun}), or allow it for the session: sudo sysctl -w kernel.yama.ptrace_scope=0")
    return AttachProblem("denied", f"ptrace of process {pid} was refused (owner uid {uid}, distdoctor uid {me}, "
                                   f"ptrace_scope {scope if scope is not None else 'not set (no Yama)'}; a seccomp or LSM policy may forbid it)",
                         f"run as root on the host: {rerun}")
