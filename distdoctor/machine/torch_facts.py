"""torch's build facts (versions, backends, GPUs, default timeouts), read here or by a child process.

A local-only `distdoctor check` needs torch for facts only, never for a process group. Importing
torch is most of that command's time (1-2 s), so the command starts a child that imports torch
and prints the facts as JSON the moment its command line says local-only, and goes on with
everything else meanwhile (on another core: a thread would share this process's GIL). Two more
gains: a torch whose import crashes (a broken CUDA library, a segfault) ends the child, not the
diagnosis; and this process never initialises CUDA.

This module imports only the standard library: the child runs it by path, without the package.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

# What a fact that could not be read looks like in the facts: {"unknown": reason}.
UNKNOWN_KEY = "unknown"
BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")
# How often the child looks whether the process that started it is gone.
PARENT_POLL_S = 0.2
# How much of the child's stderr a failure quotes.
STDERR_TAIL_LINES = 3
# How a reason that means "importing torch failed" begins, when the child says so.
CANNOT_IMPORT = "torch cannot be imported"
# The exceptions an import of a broken torch raises (a missing module, a missing shared library).
IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError", "OSError")


def import_failed(reason: str) -> bool:
    """Whether a fact's reason says that torch could not be imported at all (as opposed to an
    answer that did not come in time): the job itself would fail the same way."""
    return reason.startswith(CANNOT_IMPORT) or reason.split(":", 1)[0] in IMPORT_ERRORS


# -- the facts, read in this process (imports torch) --------------------------------------------
def read_torch_info() -> dict[str, Any]:
    """Version, CUDA, distributed, which backends are built, NCCL's version."""
    import torch  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "distributed": torch.distributed.is_available(),
        "backends": {},
        "nccl": None,
    }
    if info["distributed"]:
        import torch.distributed as dist  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

        for backend in BACKENDS:
            probe = getattr(dist, f"is_{backend}_available", None)
            info["backends"][backend] = bool(probe()) if probe else False
    if info["backends"].get("nccl"):
        try:
            info["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())
        except Exception:
            info["nccl"] = None
    info["numpy"] = read_numpy_bridge(torch)
    info["torchvision"] = read_torchvision(str(torch.__version__))
    return info


_REQUIREMENT = re.compile(r"^Requires-Dist:\s*torch\s*\(?\s*([^;)]*?)\s*\)?\s*(;.*)?$", re.M)
_CLAUSE = re.compile(r"^\s*(==|>=|<=|!=|~=|>|<)\s*([0-9][0-9a-zA-Z.+*]*)\s*$")


def read_torchvision(torch_version: str) -> dict[str, Any] | None:
    """torchvision's version and the torch release it was built for, from its installed metadata
    (its wheel's ``Requires-Dist: torch ...``), without importing it (that costs a large part of
    a torch import); None when torchvision is not installed. A torchvision built for another torch
    fails at import ("operator torchvision::nms does not exist") or in its operators."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torchvision")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    site = os.path.dirname(os.path.dirname(spec.origin))
    try:
        infos = [n for n in os.listdir(site) if n.startswith("torchvision-") and n.endswith(".dist-info")]
        if len(infos) != 1:
            return {"version": None, "requires": None, "satisfied": None}
        version = infos[0][len("torchvision-"):-len(".dist-info")]
        with open(os.path.join(site, infos[0], "METADATA"), encoding="utf-8") as fh:
            match = _REQUIREMENT.search(fh.read(65536))
    except OSError:
        return {"version": None, "requires": None, "satisfied": None}
    requires = match.group(1).strip() if match else ""
    return {"version": version, "requires": f"torch{requires}" if requires else None,
            "satisfied": satisfies(torch_version, requires) if requires else None}


def _release(version: str) -> tuple[int, ...] | None:
    found = re.match(r"\s*(\d+(?:\.\d+)*)", version)
    return tuple(int(p) for p in found.group(1).split(".")) if found else None


def satisfies(version: str, specifier: str) -> bool | None:
    """Whether ``version`` meets a requirement such as '>=2.14.0' or '==2.4.1,<3' (release parts
    only, local labels ignored); None when a clause cannot be read."""
    have = _release(version)
    if have is None:
        return None
    for clause in specifier.split(","):
        found = _CLAUSE.match(clause)
        if found is None:
            return None
        op, text = found.groups()
        if text.endswith(".*"):
            want = _release(text[:-2])
            if want is None or op not in ("==", "!="):
                return None
            equal = have[:len(want)] == want
            if equal != (op == "=="):
                return False
            continue
        want = _release(text)
        if want is None:
            return None
        width = max(len(have), len(want))
        a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
        ok = {"==": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b,
              "~=": a >= b and a[:len(want) - 1] == b[:len(want) - 1]}[op]
        if not ok:
            return False
    return True


def read_numpy_bridge(torch: Any) -> dict[str, Any] | None:
    """NumPy as this torch sees it: its version and whether torch's bridge to it works (None when
    NumPy is not installed: torch runs without it). Tried, not inferred from versions: a torch
    built against NumPy 1 (the PyPI wheels of torch 2.1) cannot use NumPy 2; torch.from_numpy then raises
    "Numpy is not available", and so does everything built on it (tensor.numpy(), DataLoader
    batches of arrays, broadcast_object_list on torch 2.1)."""
    try:
        import numpy  # torch imported it already when it could
    except Exception:
        return None
    version = str(getattr(numpy, "__version__", "?"))
    try:
        torch.from_numpy(numpy.zeros(1, dtype=numpy.float32))
    except Exception as exc:
        return {"version": version, "works": False, "error": f"{type(exc).__name__}: {str(exc).strip()[:200]}"}
    return {"version": version, "works": True}


def read_gpus() -> list[dict[str, Any]]:
    """The GPUs this process sees (after CUDA_VISIBLE_DEVICES), from torch's device properties
    (cudaGetDeviceProperties needs no context; torch.cuda.mem_get_info would create one)."""
    import torch  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

    if not torch.backends.cuda.is_built() or not torch.cuda.is_available():
        return []
    out = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        raw_uuid = getattr(props, "uuid", None)
        uuid = None
        if raw_uuid is not None:
            uuid = str(raw_uuid) if str(raw_uuid).startswith("GPU-") else f"GPU-{raw_uuid}"
        out.append({"index": index, "name": props.name, "uuid": uuid, "total_memory": int(props.total_memory)})
    return out


def read_default_timeouts() -> dict[str, float]:
    """torch's default process-group timeouts in seconds: {"nccl": ..., "other": ...}."""
    from torch.distributed import constants  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

    out = {"other": constants.default_pg_timeout.total_seconds()}
    nccl = getattr(constants, "default_pg_nccl_timeout", None)
    if nccl is not None:
        out["nccl"] = nccl.total_seconds()
    return out


def read_facts() -> dict[str, Any]:
    """Every fact, each either its value or {"unknown": reason}: one failing read spoils no other."""
    facts: dict[str, Any] = {}
    for name, read in (("torch_info", read_torch_info), ("gpus", read_gpus), ("timeouts", read_default_timeouts)):
        try:
            facts[name] = read()
        except Exception as exc:  # a probe reports, it does not crash
            facts[name] = {UNKNOWN_KEY: f"{type(exc).__name__}: {exc}"}
    return facts


# -- the child ---------------------------------------------------------------------------------
class FactsChild:
    """A child process reading the facts; ``facts()`` waits for its answer (callers bound the wait:
    the checks run under the runner's deadline) and turns any failure into {"unknown": reason}."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self._lock = threading.Lock()
        self._facts: dict[str, Any] | None = None

    @classmethod
    def start(cls) -> FactsChild | None:
        """The child, started now; None when it cannot be started (the caller reads in-process)."""
        # runpy runs this file by path: no import of the package (30 ms), and unlike `python FILE`
        # it does not put distdoctor/machine on sys.path, where its modules could shadow others.
        argv = [sys.executable, "-c", "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')",
                __file__, json.dumps(sys.path), str(os.getpid())]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, close_fds=True)
        except OSError:
            return None
        return cls(proc)

    def facts(self) -> dict[str, Any]:
        with self._lock:
            if self._facts is None:
                out, err = self.proc.communicate()
                self._facts = parse_answer(self.proc.returncode, out, err)
            return self._facts

    def finished(self) -> dict[str, Any] | None:
        """The facts if the child has answered already; never waits."""
        if self._facts is None and self.proc.poll() is None:
            return None
        return self.facts()

    def stop(self) -> None:
        """End the child (by its PID) if it still runs: nobody will read it any more."""
        if self.proc.poll() is None:
            try:
                self.proc.kill()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass


def parse_answer(returncode: int, out: bytes, err: bytes) -> dict[str, Any]:
    """The child's stdout as facts, or every fact unknown with what went wrong."""
    if returncode == 0:
        try:
            facts = json.loads(out.decode("utf-8", "replace"))
            if isinstance(facts, dict):
                return facts
        except ValueError:
            pass
        why = "the child process that imports torch printed no facts"
    elif returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        why = f"{CANNOT_IMPORT}: the child process importing it was ended by {name}"
    else:
        why = f"{CANNOT_IMPORT}: the child process importing it exited {returncode}"
    tail = [line.strip() for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
    if tail:
        why += ": " + " | ".join(tail[-STDERR_TAIL_LINES:])
    return {name: {UNKNOWN_KEY: why} for name in ("torch_info", "gpus", "timeouts")}


_prefetched: FactsChild | None = None


def prefetch() -> FactsChild | None:
    """Start the child once per process, unless torch is loaded here already (then it is free)."""
    global _prefetched
    if _prefetched is None and "torch" not in sys.modules:
        _prefetched = FactsChild.start()
        if _prefetched is not None:
            atexit.register(_prefetched.stop)
    return _prefetched


def prefetched() -> FactsChild | None:
    """The child prefetch() started in this process, if any: the probes read the facts from it."""
    return _prefetched


# -- the child's side ----------------------------------------------------------------------------
def _exit_with_parent(parent: int) -> None:
    """End this child soon after the process that started it is gone (it may have been killed
    before it could stop us): a daemon thread that never imports anything."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="distdoctor-facts-parent", daemon=True).start()


def main(argv: list[str]) -> None:
    """argv: the parent's sys.path as JSON (so the child imports the torch the parent would) and
    the parent's PID. Prints the facts as one JSON object."""
    sys.path[:] = json.loads(argv[0])
    _exit_with_parent(int(argv[1]))
    facts = read_facts()
    sys.stdout.write(json.dumps(facts))
    sys.stdout.flush()
    sys.stderr.flush()
    # The answer is out: skip the interpreter's teardown of torch (tens of ms the parent would
    # wait for, since it reads until the pipes close).
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[-2:])  # the last two arguments, whether run by path or through runpy
