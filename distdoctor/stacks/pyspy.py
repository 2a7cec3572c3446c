"""One process's thread stacks read with py-spy (`py-spy dump --pid PID --json`), bounded in time."""

# py-spy reads another process's memory to walk its Python frames. By default it is run with
# --nonblocking: it reads without stopping the process (no ptrace stop, no signal); a stack
# read from a thread that is running may then be torn, but a hung rank's threads sit still. With
# --native, py-spy must stop each thread for the dump (PTRACE_SEIZE + PTRACE_INTERRUPT, no signal
# is sent; the threads run again when it detaches, milliseconds later) to unwind C/C++ frames.
# py-spy 0.4's JSON: a list of threads, each {pid, thread_id, thread_name, os_thread_id, active,
# owns_gil, frames: [{name, filename, module, short_filename, line, ...}]}, frames innermost
# first; native frames carry `module` (the shared object), Python frames `module: null`. With
# --locals each Python frame also carries `locals` ([{name, repr, ...}]): only the type names of
# model wrappers (`<DistributedDataParallel at 0x...>`) are kept from them, never a value.

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from distdoctor.core.registry import finding_kind

DUMP_TIMEOUT_S = 10.0
_MAX_OUTPUT = 4 * 2**20
_MAX_FRAMES = 256
# A local variable's repr as py-spy gives it for an object: `<TypeName at 0x7f...>`.
_OBJECT_REPR = re.compile(r"^<([A-Za-z_][A-Za-z0-9_]{0,80}) at 0x[0-9a-f]+>$")
# The model wrappers worth knowing about (what a wait inside backward or forward can be).
# FSDP2's fully_shard names a module's class FSDP<its class>; its own helpers are not models.
_WRAPPERS = re.compile(r"^(DistributedDataParallel|FullyShardedDataParallel|FSDP(?!State$|Param|Comm|Mesh|Module$)[A-Z]\w*)$")

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
    wrappers: frozenset[str] = frozenset()   # model wrapper types among its frames' variables

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


def _is_script(path: str, mentioning: bytes = b"") -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return head.startswith(b"#!") and mentioning in head


def find_pyspy(env: Mapping[str, str] | None = None) -> str | None:
    """py-spy on PATH. When that is pyenv's shim (a script that starts a shell and `pyenv exec`: ten
    times py-spy's own 0.03 s per dump), the binary installed beside this Python is used: the one
    the shim would pick for this environment."""
    found = shutil.which("py-spy", path=(env if env is not None else os.environ).get("PATH"))
    if found is None or not _is_script(found, mentioning=b"pyenv\" exec"):
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) and not _is_script(beside) else found


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _frame(raw: Mapping[str, Any]) -> RawFrame:
    native = raw.get("module") is not None
    line = _int(raw.get("line"))
    return RawFrame(str(raw.get("name") or "?")[:200], str(raw.get("filename") or "?")[:500],
                    str(raw.get("short_filename") or raw.get("filename") or "?")[:300],
                    None if native or line is None or line <= 0 else line, native)


def _wrappers(frames: list[Any]) -> frozenset[str]:
    """The model wrapper types among the frames' local variables (their type names only)."""
    found = set()
    for frame in frames:
        for local in (frame.get("locals") or [])[:256] if isinstance(frame, Mapping) and isinstance(frame.get("locals"), list) else ():
            match = _OBJECT_REPR.match(str(local.get("repr") or "")) if isinstance(local, Mapping) else None
            if match and _WRAPPERS.match(match[1]):
                found.add(match[1])
    return frozenset(found)


def parse(text: str) -> tuple[Thread, ...]:
    """py-spy's JSON -> threads; anything malformed -> ValueError."""
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("py-spy's output is not a list of threads")
    threads = []
    for raw in data[:512]:
        if not isinstance(raw, Mapping):
            continue
        raw_frames = [f for f in (raw.get("frames") or [])[:_MAX_FRAMES] if isinstance(f, Mapping)]
        threads.append(Thread(str(raw.get("thread_name") or "")[:100], _int(raw.get("os_thread_id")),
                              not bool(raw.get("active")), bool(raw.get("owns_gil")),
                              tuple(_frame(f) for f in raw_frames), _wrappers(raw_frames)))
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


def dump(pid: int, *, native: bool = False, timeout_s: float = DUMP_TIMEOUT_S, pyspy: str | None = None,
         local_types: bool = False) -> Dump:
    """Read every thread's stack of one process; never raises. local_types: also read the frames'
    variables (--locals) for the model's wrapper type; when that read fails, it is done again
    without them (a variable of a thread that runs can be torn)."""
    program = pyspy or find_pyspy()
    if program is None:
        return Dump(problem=MISSING, message="py-spy not found on PATH")
    argv = [program, "dump", "--pid", str(pid), "--json"] + (["--native"] if native else ["--nonblocking"])
    started = time.monotonic()
    if local_types:
        read = _run([*argv, "--locals"], timeout_s, program)
        left = timeout_s - (time.monotonic() - started)
        if read.problem != FAILED or left <= 0.05:
            return read
        timeout_s = left
    read = _run(argv, timeout_s, program)
    return Dump(read.threads, read.problem, read.message, time.monotonic() - started)


_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()


def _run(argv: list[str], timeout_s: float, program: str) -> Dump:
    started = time.monotonic()
    try:
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    except OSError as exc:
        return Dump(problem=MISSING, message=f"cannot run {program}: {exc.strerror or exc}")
    with _RUNNING_LOCK:
        _RUNNING.add(child)
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return Dump(problem=FAILED, message=f"py-spy did not answer within {timeout_s:g} s",
                    seconds=time.monotonic() - started)
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(child)
    seconds = time.monotonic() - started
    if child.returncode != 0:
        problem, message = classify(child.returncode, err[-_MAX_OUTPUT:].decode("utf-8", "replace"))
        if child.returncode < 0:
            message = f"py-spy was ended by signal {-child.returncode}"
        return Dump(problem=problem, message=message, seconds=seconds)
    try:
        return Dump(threads=parse(out[:_MAX_OUTPUT].decode("utf-8", "replace")), seconds=seconds)
    except ValueError as exc:
        return Dump(problem=FAILED, message=f"py-spy's output could not be read: {exc}", seconds=seconds)


def end_running() -> None:
    """SIGKILL, by PID, the py-spy processes this process started that still run (a look that
    decided, or was interrupted, does not wait for a slow dump)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for child in running:
        try:
            child.kill()
        except OSError:
            pass
