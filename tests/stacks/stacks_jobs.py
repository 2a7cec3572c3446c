"""Real hung torchrun jobs for the `distdoctor stacks` tests: started, waited for, ended by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]
TRAIN = Path(__file__).parent / "jobs" / "train.py"
# Every rank imports torch and forms a gloo group; on a loaded 2-core machine that takes a while.
READY_S = 180.0


def line_of(text: str) -> int:
    """The line number of `text` in the job script (so tests follow edits to it)."""
    for number, line in enumerate(TRAIN.read_text().splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {TRAIN}")


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI", "TORCHELASTIC_", "DISTDOCTOR_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH", "")])])
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


@dataclass
class Job:
    launcher: subprocess.Popen
    ready: Path
    nproc: int

    @property
    def pid(self) -> int:
        return self.launcher.pid

    def rank_pids(self) -> dict[int, int]:
        return {int(p.name[4:]): int(p.read_text() or 0) for p in self.ready.glob("rank*") if p.read_text()}

    def alive(self) -> bool:
        return self.launcher.poll() is None

    def log(self) -> str:
        return (self.ready.parent / "job.log").read_text(errors="replace")[-3000:]


def end_process(pid: int, mark: str | None = None) -> None:
    """SIGKILL pid, and only while it is still a process we started (its command line holds mark,
    the job's own ready directory): a PID that ended may belong to another process now."""
    import psutil

    try:
        if mark is not None and mark not in psutil.Process(pid).cmdline():
            return
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, psutil.NoSuchProcess, psutil.ZombieProcess):
        pass


@contextmanager
def hung_job(tmp: Path, mode: str, nproc: int, *launcher_args: str, argv_prefix: tuple[str, ...] = (),
             env: dict[str, str] | None = None, script: Path = TRAIN) -> Iterator[Job]:
    """torchrun (sys.executable -m torch.distributed.run) running train.py MODE, every rank at its hang point."""
    ready = tmp / "ready"
    ready.mkdir(parents=True, exist_ok=True)
    argv = [*argv_prefix, sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            *launcher_args, str(script), mode, str(ready)]
    with open(tmp / "job.log", "wb") as log:
        launcher = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env or child_env(), cwd=str(tmp))
    job = Job(launcher, ready, nproc)
    try:
        deadline = time.monotonic() + READY_S
        while len(job.rank_pids()) < nproc:
            if launcher.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the job did not reach its hang point (exit {launcher.poll()}):\n{job.log()}")
            time.sleep(0.2)
        yield job
    finally:
        # The workers first (by the PIDs they wrote), then the launcher; nothing else is touched.
        for pid in job.rank_pids().values():
            end_process(pid, mark=str(ready))
        end_process(launcher.pid)
        launcher.wait(30)


def distdoctor(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distdoctor", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or child_env(), stdin=subprocess.DEVNULL)


def report_of(result: subprocess.CompletedProcess) -> dict:
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def stacks_once(args: list[str], env: dict[str, str] | None = None) -> tuple[dict, int]:
    """`distdoctor stacks --format json ARGS`, once: the report and exit code of its first verdict."""
    result = distdoctor("stacks", "--format", "json", *args, env=env)
    return report_of(result), result.returncode


def finding(report: dict, finding_id: str) -> dict | None:
    return next((f for f in report["findings"] if f["id"] == finding_id), None)


def ids(report: dict) -> list[str]:
    return [f["id"] for f in report["findings"]]
