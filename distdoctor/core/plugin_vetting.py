"""Site files imported first in a child process under a deadline, so none can hang the run.

A thread cannot bound an import: a file that blocks at import (a socket without a timeout, an
input()) or holds the interpreter lock (a pure-Python busy loop in C, a huge regex) stops the
process that imports it, deadline thread included. So ``--checks-dir`` files are imported once
in a child (``python -c``) that reports on a private pipe after each file; the parent waits with
a deadline per file and kills the child (by its pid) when one overruns or ends the process. Only
the files that imported in the child are imported here. A healthy directory costs one child
process (about 0.1 s); a run without ``--checks-dir`` costs nothing.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

# The child: report "start i", import file i with fd 1/2 sent to /dev/null (a plugin's prints
# must not reach the parent's report), then "ok i" or "error i"; the protocol uses a dup of fd 1.
_CHILD = r"""
import json, os, sys
proto = os.fdopen(os.dup(1), "w", buffering=1)
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0); os.dup2(null, 1); os.dup2(null, 2)
from distdoctor.core.registry import _import_file
from pathlib import Path
for i, name in enumerate(sys.argv[1:]):
    proto.write(json.dumps(["start", i]) + "\n")
    try:
        _import_file(Path(name))
        proto.write(json.dumps(["ok", i]) + "\n")
    except BaseException as exc:
        proto.write(json.dumps(["error", i, type(exc).__name__]) + "\n")
proto.write(json.dumps(["done"]) + "\n")
proto.flush()
os._exit(0)
"""


def vet_files(files: Sequence[Path], timeout: float, budget: float | None = None) -> dict[Path, str]:
    """file -> why it must not be imported here (absent when it imported in the child, or raised:
    an exception is reported by the normal in-process load with its message).

    ``timeout`` bounds each file; ``budget`` (default: twice ``timeout``) bounds the whole
    directory, so many blocking files cannot add up: the files not vetted by then are not loaded.
    """
    problems: dict[Path, str] = {}
    pending = list(files)
    end = time.monotonic() + (2 * timeout if budget is None else budget)
    while pending:
        if time.monotonic() >= end:
            for file in pending:
                problems[file] = "not vetted before the loading deadline (earlier files blocked); not loaded"
            return problems
        problem = _vet_batch(pending, timeout, end)
        if problem is None:
            return problems
        index, why = problem
        problems[pending[index]] = why
        pending = pending[index + 1 :]  # the files after it get a fresh child
    return problems


def _child_env() -> dict[str, str]:
    """This process's environment with the distdoctor that runs here first on the path."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _vet_batch(files: Sequence[Path], timeout: float, end: float) -> tuple[int, str] | None:
    """Import ``files`` in one child: (index, problem) of the first bad one, or None."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, *map(str, files)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=_child_env(), start_new_session=True,
    )
    assert child.stdout is not None
    current = -1
    # The interpreter's own start is not the file's fault: the first file gets a little more.
    deadline = min(time.monotonic() + timeout + min(2.0, timeout), end + min(2.0, timeout))
    buffer = b""
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return (max(current, 0), f"its import did not finish within {timeout:g}s "
                              "(it blocks at import or holds the interpreter lock); not loaded")
            ready, _, _ = select.select([child.stdout], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(child.stdout.fileno(), 65536)
            if not chunk:
                code = child.wait(timeout=5)
                how = f"exit code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
                return (max(current, 0), f"it ended the process at import ({how}, e.g. os._exit or "
                              "sys.exit outside a function); not loaded")
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                message = json.loads(line)
                if message[0] == "done":
                    return None
                if message[0] == "start":
                    current = message[1]
                    deadline = min(time.monotonic() + timeout, end)
    finally:
        _end(child)


def _end(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    if child.stdout is not None:
        child.stdout.close()
