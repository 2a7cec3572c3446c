"""Run a function in N fresh processes, each one rank of an initialized process group.

This is the machinery behind ``@pytest.mark.distributed``; it works without pytest too:

    from distdoctor.testing import run_distributed
    result = run_distributed("mypkg.tests.test_ddp:check_allreduce", world_size=2, timeout=60)
    assert result.ok, result.failure_message()

How it runs (and why):
- Fresh interpreters (``python -m distdoctor.testing <spec>``), like multiprocessing's spawn:
  forking a pytest process that may already hold torch's thread pools (OpenMP, gloo) can
  deadlock the children; a fresh interpreter costs one torch import per rank.
- The function is found again in the child by module name (pytest puts test directories on
  sys.path; the parent's sys.path is handed over) or, failing that, by file path.
- No free-port race: the parent binds a listening socket on 127.0.0.1 port 0 and hands the
  descriptor to rank 0, whose TCPStore serves on it (``master_listen_fd``); the other ranks
  connect to that port. The group is then ``init_process_group(backend, store=..., rank=...,
  world_size=..., timeout=...)``; RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT
  are set as a launcher would, and OMP_NUM_THREADS=1 as torchrun sets it for several workers
  (unless the caller's environment has it).
- Arguments (pytest's fixture values) are pickled to the children (parent and children are
  the same trusted user). Each rank writes its outcome (passed/failed/skipped + traceback) to a
  JSON file; stdout/stderr go to a file per rank.
- Deadline: ``timeout`` covers everything, process start included. When a rank fails the
  others get ``grace`` seconds to finish (they are often blocked in a collective with the failed
  rank) and are then killed. Every child runs in its own session; its whole process group is
  killed with SIGKILL and the absence of survivors verified (``leftover`` lists any).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
import importlib
import importlib.util
from datetime import timedelta
from distdoctor.core.report import format_ranks
from distdoctor.machine.torchrun_env import worker_thread_default

STATUS_PASSED, STATUS_FAILED, STATUS_SKIPPED = "passed", "failed", "skipped"
STATUS_DIED, STATUS_TIMEOUT, STATUS_KILLED = "died", "timeout", "killed"
OUTPUT_TAIL = 4000


@dataclass
class RankResult:
    rank: int
    status: str
    traceback: str = ""
    message: str = ""
    exitcode: int | None = None
    output: str = ""
    # When the rank reported (epoch seconds): the first failure is usually the cause.
    finished_at: float | None = None


@dataclass
class DistributedResult:
    world_size: int
    ranks: dict[int, RankResult]
    duration_s: float
    timeout: float
    leftover: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.status in (STATUS_PASSED, STATUS_SKIPPED) for r in self.ranks.values()) and not self.leftover

    @property
    def skipped(self) -> RankResult | None:
        """Rank 0's skip when every rank skipped (pytest.skip inside the test)."""
        if self.ranks and all(r.status == STATUS_SKIPPED for r in self.ranks.values()):
            return self.ranks[min(self.ranks)]
        return None

    def failed_ranks(self) -> list[int]:
        """Failed ranks, the first to fail first (the others often fail because of it)."""
        failed = [r for r, res in self.ranks.items() if res.status == STATUS_FAILED]
        return sorted(failed, key=lambda r: (self.ranks[r].finished_at or float("inf"), r))

    def unfinished_ranks(self) -> list[int]:
        return sorted(r for r, res in self.ranks.items() if res.status in (STATUS_TIMEOUT, STATUS_KILLED))

    def failure_message(self) -> str:

        lines: list[str] = []
        failed = self.failed_ranks()
        died = sorted(r for r, res in self.ranks.items() if res.status == STATUS_DIED)
        timed_out = sorted(r for r, res in self.ranks.items() if res.status == STATUS_TIMEOUT)
        killed = sorted(r for r, res in self.ranks.items() if res.status == STATUS_KILLED)
        if failed:
            first = self.ranks[failed[0]]
            lines.append(f"{_label(sorted(failed))} of {self.world_size} failed; rank {failed[0]} failed first: "
                         f"{first.message.splitlines()[0] if first.message else 'see its traceback'}")
        if died:
            codes = ", ".join(f"rank {r}: exit code {self.ranks[r].exitcode}" for r in died)
            lines.append(f"{_label(died)} died without reporting a result ({codes})")
        if timed_out:
            lines.append(f"{_label(timed_out)} did not finish within the {self.timeout:g} s timeout "
                         f"(ranks that finished: {format_ranks(r for r, s in self.ranks.items() if s.status in (STATUS_PASSED, STATUS_FAILED, STATUS_SKIPPED)) or 'none'})")
        if killed:
            lines.append(f"{_label(killed)} killed after another rank failed (blocked waiting for it)")
        if self.leftover:
            lines.append(f"processes left behind after kill: pids {self.leftover}")
        for rank in failed + died + timed_out:
            res = self.ranks[rank]
            lines.append("")
            lines.append(f"---------- rank {rank} ({res.status}) ----------")
            if res.traceback:
                lines.append(res.traceback.rstrip())
            if res.output.strip():
                lines.append(f"---------- rank {rank} output (last {OUTPUT_TAIL} characters) ----------")
                lines.append(res.output.rstrip())
        return "\n".join(lines)


def _label(ranks: list[int]) -> str:

    return ("Rank " if len(ranks) == 1 else "Ranks ") + format_ranks(ranks)


# -- parent side -------------------------------------------------------------------------------


def run_distributed(
    target: str | Callable[..., Any],
    *,
    world_size: int = 2,
    backend: str = "gloo",
    timeout: float = 60.0,
    args: tuple = (),
    kwargs: dict[str, Any] | None = None,
    module_file: str | None = None,
    env: dict[str, str] | None = None,
    grace: float = 3.0,
    guard: dict[str, Any] | None = None,
) -> DistributedResult:
    """Run ``target`` ("module:qualname" or an importable function) on ``world_size`` ranks.

    ``guard``: distdoctor.guard's arguments, to run the function with the runtime guard on.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    module, qualname, file = _locate(target, module_file)
    started = time.monotonic()
    deadline = started + float(timeout)
    workdir = Path(tempfile.mkdtemp(prefix="distdoctor-test-"))
    payload = workdir / "args.pickle"
    payload.write_bytes(pickle.dumps((tuple(args), dict(kwargs or {}))))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(max(128, world_size * 4))
    port = listener.getsockname()[1]
    procs: dict[int, subprocess.Popen] = {}
    outputs: dict[int, Any] = {}
    try:
        for rank in range(world_size):
            spec = {
                "module": module, "qualname": qualname, "file": file, "sys_path": list(sys.path),
                "rank": rank, "world_size": world_size, "backend": backend, "host": "127.0.0.1",
                "port": port, "listen_fd": listener.fileno() if rank == 0 else None,
                "timeout": float(timeout), "deadline_epoch": time.time() + float(timeout),
                "result": str(workdir / f"result-{rank}.json"), "args": str(payload), "guard": guard,
            }
            spec_path = workdir / f"spec-{rank}.json"
            spec_path.write_text(json.dumps(spec))
            # In a test a stall ends the test at the guard's hang timeout (CI wants the failure now, not
            # a job's patience): every guard started in these ranks defaults to on_hang="exit".
            child_env = {"DISTDOCTOR_GUARD_ON_HANG": "exit", **os.environ, **(env or {})}
            child_env.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                              "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
                              "MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1"})
            child_env.update(worker_thread_default(child_env, world_size))  # as torchrun does for its workers
            out = open(workdir / f"output-{rank}.txt", "wb")
            outputs[rank] = out
            procs[rank] = subprocess.Popen(
                [sys.executable, "-m", "distdoctor.testing", str(spec_path)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=child_env,
                pass_fds=(listener.fileno(),) if rank == 0 else (), start_new_session=True,
            )
        listener.close()  # rank 0 holds its own copy of the descriptor
        statuses = _supervise(procs, workdir, deadline, grace)
    finally:
        listener.close()
        leftover = _kill_all(procs)
        for out in outputs.values():
            out.close()
    results = {rank: _collect(rank, procs[rank], statuses.get(rank), workdir) for rank in procs}
    _cleanup(workdir)
    return DistributedResult(world_size, results, time.monotonic() - started, float(timeout), leftover)


def _locate(target: str | Callable[..., Any], module_file: str | None) -> tuple[str, str, str | None]:
    if isinstance(target, str):
        module, sep, qualname = target.partition(":")
        if not sep or not qualname:
            raise ValueError(f"target {target!r} must be 'module:function'")
        return module, qualname, module_file
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(f"{target!r} cannot be found again in a child process: use a module-level function")
    file = module_file or getattr(sys.modules.get(module), "__file__", None)
    return module, qualname, file


def _supervise(procs: dict[int, subprocess.Popen], workdir: Path, deadline: float, grace: float) -> dict[int, str]:
    """Wait for the ranks; returns rank -> 'timeout'/'killed' for those stopped by us."""
    stop_at = deadline
    stopped: dict[int, str] = {}
    failure_seen = False
    while True:
        running = [r for r, p in procs.items() if p.poll() is None]
        if not running:
            return stopped
        if not failure_seen and _any_failure(procs, workdir):
            failure_seen = True
            stop_at = min(deadline, time.monotonic() + grace)
        if time.monotonic() >= stop_at:
            reason = STATUS_TIMEOUT if stop_at >= deadline and not failure_seen else STATUS_KILLED
            for r in running:
                # A rank that already reported is only tearing down: not the one that hung.
                if not (workdir / f"result-{r}.json").exists():
                    stopped[r] = reason
            return stopped
        time.sleep(0.02)


def _any_failure(procs: dict[int, subprocess.Popen], workdir: Path) -> bool:
    for rank, proc in procs.items():
        result = workdir / f"result-{rank}.json"
        if result.exists():
            try:
                if json.loads(result.read_text()).get("status") == STATUS_FAILED:
                    return True
            except (OSError, ValueError):
                pass
        elif proc.poll() is not None:
            return True  # exited without a result: died
    return False


def _kill_all(procs: dict[int, subprocess.Popen]) -> list[int]:
    """SIGKILL each child's process group (the child and anything it started); verify."""
    for proc in procs.values():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in procs.values():
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    leftover = []
    for proc in procs.values():
        if proc.poll() is None:
            leftover.append(proc.pid)
            continue
        try:
            os.killpg(proc.pid, 0)  # anyone left in the child's process group?
            leftover.append(proc.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return leftover


def _collect(rank: int, proc: subprocess.Popen, stopped: str | None, workdir: Path) -> RankResult:
    output = ""
    try:
        output = (workdir / f"output-{rank}.txt").read_bytes()[-OUTPUT_TAIL:].decode("utf-8", "replace")
    except OSError:
        pass
    result_file = workdir / f"result-{rank}.json"
    if result_file.exists():
        try:
            data = json.loads(result_file.read_text())
            return RankResult(rank, data.get("status", STATUS_FAILED), data.get("traceback", ""),
                              data.get("message", ""), proc.returncode, output, data.get("time"))
        except (OSError, ValueError):
            pass
    if stopped:
        return RankResult(rank, stopped, exitcode=proc.returncode, output=output)
    return RankResult(rank, STATUS_DIED, exitcode=proc.returncode, output=output)


def _cleanup(workdir: Path) -> None:
    for path in workdir.iterdir():
        try:
            path.unlink()
        except OSError:
            pass
    try:
        workdir.rmdir()
    except OSError:
        pass


# -- child side --------------------------------------------------------------------------------


def _child(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    result_path = Path(spec["result"])

    def write(status: str, tb: str = "", message: str = "") -> None:
        tmp = result_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"status": status, "traceback": tb, "message": message, "time": time.time()}))
        tmp.replace(result_path)

    store = None
    try:
        sys.path[:] = spec["sys_path"]
        fn = _find_function(spec["module"], spec["qualname"], spec.get("file"))
        args, kwargs = pickle.loads(Path(spec["args"]).read_bytes())
        store = _init_group(spec)
        _report_guard_hangs(write)
        if spec.get("guard"):
            from distdoctor.embedded.guard import guard  # the embedded modules import torch; loaded only on this path

            guard(**{"on_hang": "exit", **spec["guard"]})
        fn(*args, **kwargs)
        write(STATUS_PASSED)
    except BaseException as exc:  # noqa: BLE001 - every outcome must be reported to the parent
        if type(exc).__name__ == "Skipped":  # pytest.skip() inside the test
            write(STATUS_SKIPPED, message=str(getattr(exc, "msg", exc)))
        else:
            # Drop this function's own frame: the traceback starts in the user's code.
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next or exc.__traceback__))
            write(STATUS_FAILED, tb=tb, message=f"{type(exc).__name__}: {exc}")
    _wait_for_peers(store, spec)
    sys.stdout.flush()
    sys.stderr.flush()
    # No destroy_process_group/atexit: a peer that failed could make teardown block.
    os._exit(0)


def _report_guard_hangs(write: Callable[..., None]) -> None:
    """When the runtime guard ends this rank after a hang, the rank fails with the guard's report."""
    from distdoctor.embedded.guard import on_hang_exit, render_text  # the embedded modules import torch; loaded only on this path

    def failed(report: Any) -> None:
        first = report.findings[0] if report.findings else None
        headline = f"{first.id} [{first.cause}] {first.title}" if first else "a hang"
        write(STATUS_FAILED, message=f"GuardError: {headline}\n" + render_text(report, "the guard diagnosed a hang:"))

    on_hang_exit(failed)


def _find_function(module_name: str, qualname: str, file: str | None) -> Callable[..., Any]:

    try:
        module = importlib.import_module(module_name)
    except ImportError:
        if not file:
            raise
        spec = importlib.util.spec_from_file_location(module_name, file)
        if spec is None or spec.loader is None:
            raise
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    obj: Any = module
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        obj = getattr(obj, part)
        if isinstance(obj, type) and i < len(parts) - 1:
            obj = obj()  # a test class: pytest makes a fresh instance per test, so do we
    # pytest marks and other decorators keep the function itself callable.
    return obj


def _init_group(spec: dict[str, Any]) -> Any:

    import torch.distributed as dist  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

    remaining = max(1.0, spec["deadline_epoch"] - time.time())
    timeout = timedelta(seconds=remaining)
    if spec["rank"] == 0:
        # world.store_api: a torch whose default store backend cannot serve on a given socket (2.4)
        # gets the one that can; the store serves on its own copy of the descriptor.
        from distdoctor.world.store_api import serve_on_listener

        store = serve_on_listener(spec["host"], spec["port"], spec["listen_fd"], world_size=spec["world_size"],
                                  timeout=timeout, wait_for_workers=False)
        os.close(spec["listen_fd"])
    else:
        store = dist.TCPStore(spec["host"], spec["port"], spec["world_size"], False, timeout)
    dist.init_process_group(spec["backend"], store=store, rank=spec["rank"], world_size=spec["world_size"],
                            timeout=timeout)
    return store


def _wait_for_peers(store: Any, spec: dict[str, Any]) -> None:
    """Every rank stays until every rank has reported (bounded): a rank that exits closes its gloo
    pairs, and a slower peer still inside init_process_group's connectFullMesh (or reading the
    last bytes of a collective) then fails with "Connection closed by peer" (seen at load 4 on 2
    cores: rank 1 of 3 done and gone while rank 0 was still connecting). Rank 0 also hosts the
    store, so no peer loses it early."""
    if store is None:
        return
    try:
        store.add("distdoctor/testing/done", 1)
        end = min(spec["deadline_epoch"], time.time() + 30)
        while time.time() < end and store.add("distdoctor/testing/done", 0) < spec["world_size"]:
            time.sleep(0.01)
    except Exception:
        pass


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m distdoctor.testing <spec.json> (started by distdoctor.testing.run_distributed)",
              file=sys.stderr)
        sys.exit(2)
    sys.exit(_child(sys.argv[1]))
