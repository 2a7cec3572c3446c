"""One site check run in a forked child under its deadline, its findings back as JSON on a pipe.

A thread is enough for distdoctor's own checks, whose waits all release the interpreter lock.
A site check may not behave: a busy loop in C that holds the lock, ``os._exit``, a segfault, a
print that would corrupt a JSON report. In a forked child (which inherits the check context
as it is, at the cost of a fork, ~1 ms) none of these reach this process: the parent waits
on the pipe with the deadline, kills the child by its pid when it overruns, and reports a child
that ended without an answer as a crashed check. The child's stdout and stderr go to /dev/null.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
import traceback
import warnings
from typing import Any, Callable

from distdoctor.core.findings import Finding
from distdoctor.core.redact import scrub
from distdoctor.core.registry import SkipCheck

# A check's answer larger than this is refused (a runaway plugin must not fill memory).
MAX_ANSWER_BYTES = 8 * 1024 * 1024


def run_in_child(check: Any, ctx: Any, limit: float, box: dict[str, Any], consume: Callable[[Any], list[Finding]]) -> bool:
    """Run ``check`` in a child; fill ``box`` as the thread runner does. True when it overran.

    ``consume`` turns what the check returned into findings (the runner's own rule).
    """
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        # Forking a process that has threads is safe here: the child only runs the check
        # and writes to the pipe, and it is killed if it deadlocks on a lock held at fork.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_fd)
        _child(check, ctx, write_fd, consume)
    os.close(write_fd)
    try:
        answer, overran = _read_answer(read_fd, limit)
    finally:
        os.close(read_fd)
    status = _reap(pid, kill=overran or answer is None)
    if overran:
        return True
    _unpack(answer, status, box)
    return False


def _child(check: Any, ctx: Any, write_fd: int, consume: Callable[[Any], list[Finding]]) -> None:

    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            out: dict[str, Any] = {"findings": [scrub(f.to_dict()) for f in consume(check.func(ctx))]}
        except SkipCheck as skip:
            out = {"skip": str(skip.reason)}
        except BaseException as exc:  # reported as a crashed check, as in the thread runner
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-4))
            out = {"error": [type(exc).__name__, str(exc), tb]}
        data = json.dumps(out).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view):]
    finally:
        os._exit(0)


def _read_answer(fd: int, limit: float) -> tuple[bytes | None, bool]:
    """(the child's bytes or None when too large, whether it overran ``limit``)."""
    deadline = time.monotonic() + limit
    chunks: list[bytes] = []
    size = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, True
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks), False
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            return None, False
        chunks.append(chunk)


def _reap(pid: int, *, kill: bool) -> int:
    """Wait for the child (killed first when asked); its wait status."""
    if kill:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5.0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:  # unkillable (D state): leave it, never hang
            return 0
        time.sleep(0.005)


def _exception(name: str, message: str) -> BaseException:
    """An exception named like the child's, for the crashed-check finding's title."""
    return type(name if name.isidentifier() else "Error", (Exception,), {})(message)


def _unpack(answer: bytes | None, status: int, box: dict[str, Any]) -> None:
    if answer is None:
        box["error"] = _exception("AnswerTooLarge", f"the check's findings exceed {MAX_ANSWER_BYTES} bytes")
        return
    try:
        out = json.loads(answer) if answer else None
    except ValueError:
        out = None
    if not isinstance(out, dict):
        how = (f"exit code {os.waitstatus_to_exitcode(status)}" if os.WIFEXITED(status)
               else f"signal {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status) else "unknown")
        box["error"] = _exception("ProcessEnded", f"the check ended its process ({how}) without returning")
        box["traceback"] = "The check ran in a child process, which ended before answering (os._exit, a crash)."
        return
    if "skip" in out:
        box["skip"] = str(out["skip"])
    elif "error" in out:
        name, message, tb = (list(out["error"]) + ["", "", ""])[:3]
        box["error"] = _exception(str(name), str(message))
        box["traceback"] = str(tb)
    else:
        box["findings"] = [Finding.from_dict(f) for f in out.get("findings", ())]
