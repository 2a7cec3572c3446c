"""One process's thread stacks read with py-spy (`py-spy dump --pid PID --json`), bounded in time."""

# py-spy reads another process's memory to walk its Python frames. By default it is run with
# --nonblocking: it reads without stopping the process (no ptrace stop, no signal); a stack
# read from a thread that is running may then be torn, but a hung rank's threads sit still. With
# --native, py-spy must stop each thread for the dump (PTRACE_SEIZE + PTRACE_INTERRUPT, no signal
# is sent; the threads run again when it detaches, milliseconds later) to unwind C/C++ frames.
# py-spy 0.4's JSON: a list of threads, each {pid, thread_id, thread_name, os_thread_id, active,
# owns_gil, frames: [{name, filename, module, short_filename, line, ...}]}, frames innermost
# first; native frames carry `module` (the shared object), Python frames `module: null`.

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Mapping

from distdoctor.core.registry import finding_kind

DUMP_TIMEOUT_S = 10.0
_MAX_OUTPUT = 4 * 2**20
_MAX_FRAMES = 256

# What went wrong, for the caller to phrase (attach problems need the process's owner etc.).
MISSING, DENIED, GONE, NOT_PYTHON, FAILED = "missing", "denied", "gone", "not_python", "failed"

PYSPY_MISSING = finding_kind(
    "stacks.E002", cause="unknown", title="py-spy is not installed: no stack can be read",
    hint="pip install py-spy (distdoctor depends on it; it is missing from this environment's PATH)")
NOT_PYTHON = finding_kind(
    "stacks.E003", cause="unknown", title="A process is not a Python program py-spy can read",
    hint="Give the PID of a Python rank (a worker of torchrun, srun or mpirun), not of a shell, a C++ binary or a container runtime")
DUMP_FAILED = finding_kind(
    "stacks.E004", cause="unknown", title="py-spy could not read a rank's stack",
    hint="Run `py-spy dump --pid PID` by hand to see its full error; a Python newer than this py-spy knows needs `pip install -U py-spy`")


@dataclass(frozen=True)
class RawFrame:
    function: str
    file: str           # as the process knows it (may be relative to its working directory)
    short: str          # py-spy's short form (torch/autograd/graph.py)
    line: int | None
    native: bool


@dataclass(frozen=True)
class Thread:
    name: str
    os_thread_id: int | None
    idle: bool
    owns_gil: bool
    frames: tuple[RawFrame, ...]   # innermost first, as py-spy gives them

    @property
    def is_main(self) -> bool:
        return self.name == "MainThread"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "os_thread_id": self.os_thread_id, "idle": self.idle, "owns_gil": self.owns_gil,
                "frames": [{"function": f.function, "file": f.short if f.native else f.file, "line": f.line,
                            "native": f.native} for f in self.frames]}


@dataclass(frozen=True)
class Dump:
    """Threads, or why there are none (problem: one of MISSING ... FAILED, message: py-spy's words)."""

    threads: tuple[Thread, ...] = ()
    problem: str | None = None
    message: str = ""
    seconds: float = 0.0

    @property
    def main(self) -> Thread | None:
        return next((t for t in self.threads if t.is_main), self.threads[0] if self.threads else None)


def find_pyspy(env: Mapping[str, str] | None = None) -> str | None:
    return shutil.which("py-spy", path=(env if env is not None else os.environ).get("PATH"))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _frame(raw: Mapping[str, Any]) -> RawFrame:
    native = raw.get("module") is not None
    line = _int(raw.get("line"))
    return RawFrame(str(raw.get("name") or "?")[:200], str(raw.get("filename") or "?")[:500],
                    str(raw.get("short_filename") or raw.get("filename") or "?")[:300],
                    None if native or line is None or line <= 0 else line, native)


def parse(text: str) -> tuple[Thread, ...]:
    """py-spy's JSON -> threads; anything malformed -> ValueError."""
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("py-spy's output is not a list of threads")
    threads = []
    for raw in data[:512]:
        if not isinstance(raw, Mapping):
            continue
        frames = tuple(_frame(f) for f in (raw.get("frames") or [])[:_MAX_FRAMES] if isinstance(f, Mapping))
        threads.append(Thread(str(raw.get("thread_name") or "")[:100], _int(raw.get("os_thread_id")),
                              not bool(raw.get("active")), bool(raw.get("owns_gil")), frames))
    return tuple(threads)


def classify(returncode: int, stderr: str) -> tuple[str, str]:
    """py-spy's failure -> (problem, its first meaningful line)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.startswith(" ")]
    first = next((ln for ln in lines if not ln.startswith("Stack backtrace")), f"py-spy exited with {returncode}")
    text = stderr.lower()
    if "permission denied" in text or "operation not permitted" in text or "os error 1)" in text:
        return DENIED, first
    if "no such process" in text or "check that the process is running" in text or "os error 3)" in text:
        return GONE, first
    if "failed to find python version" in text or "failed to find a python interpreter" in text:
        return NOT_PYTHON, first
    return FAILED, first


def dump(pid: int, *, native: bool = False, timeout_s: float = DUMP_TIMEOUT_S, pyspy: str | None = None) -> Dump:
    """Read every thread's stack of one process; never raises."""
    program = pyspy or find_pyspy()
    if program is None:
        return Dump(problem=MISSING, message="py-spy not found on PATH")
    argv = [program, "dump", "--pid", str(pid), "--json"] + (["--native"] if native else ["--nonblocking"])
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Dump(problem=FAILED, message=f"py-spy did not answer within {timeout_s:g} s",
                    seconds=time.monotonic() - started)
    except OSError as exc:
        return Dump(problem=MISSING, message=f"cannot run {program}: {exc.strerror or exc}")
    seconds = time.monotonic() - started
    stderr = done.stderr[-_MAX_OUTPUT:].decode("utf-8", "replace")
    if done.returncode != 0:
        problem, message = classify(done.returncode, stderr)
        return Dump(problem=problem, message=message, seconds=seconds)
    try:
        return Dump(threads=parse(done.stdout[:_MAX_OUTPUT].decode("utf-8", "replace")), seconds=seconds)
    except ValueError as exc:
        return Dump(problem=FAILED, message=f"py-spy's output could not be read: {exc}", seconds=seconds)
