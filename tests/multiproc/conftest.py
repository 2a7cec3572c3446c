"""Helpers for real multi-process worlds on loopback: start, watch, end by PID, prove nothing is left.

Every process a test starts goes through :class:`Procs`: it records the PIDs of the processes
and of all their descendants (polled while they run), ends whatever is still alive when the
test is done (SIGKILL by PID, never by name), and :meth:`Procs.assert_no_orphans` checks that
every PID it ever saw is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.conftest import json_objects

HERE = Path(__file__).resolve().parent
HANG_CHECKS = HERE / "hang_checks"
LAUNCHER_PREFIXES = ("DISTDOCTOR_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "JSM_", "PET_", "NCCL_", "GLOO_")
LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                  "GROUP_RANK", "ROLE_RANK", "NODE_RANK")


def base_env(**extra: str) -> dict[str, str]:
    """This environment without launcher variables, with one thread per rank (2 cores shared)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES) and k not in LAUNCHER_NAMES}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def distdoctor(*args: str) -> list[str]:
    return [sys.executable, "-m", "distdoctor", *args]


@dataclass
class Proc:
    popen: subprocess.Popen
    started: float
    ended: float | None = None
    stdout: str = ""
    stderr: str = ""

    @property
    def rc(self) -> int | None:
        return self.popen.returncode

    @property
    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def reports(self) -> list[dict]:
        """Every JSON report on stdout (one unless --all-ranks)."""
        return json_objects(self.stdout)

    def report(self) -> dict:
        reports = self.reports()
        assert len(reports) == 1, f"expected one report, got {len(reports)}:\n{self.stdout}\n{self.stderr[-3000:]}"
        return reports[0]


@dataclass
class Procs:
    procs: list[Proc] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)

    def start(self, cmd: list[str], env: dict[str, str], cwd: str | None = None) -> Proc:
        popen = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc = Proc(popen, time.monotonic())
        self.procs.append(proc)
        self.seen.add(popen.pid)
        return proc

    def _watch(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                try:
                    for child in psutil.Process(proc.popen.pid).children(recursive=True):
                        self.seen.add(child.pid)
                except psutil.Error:
                    pass

    def wait(self, timeout: float) -> list[Proc]:
        """Wait for all (collecting output without blocking pipes); kill what outlives timeout."""
        import threading

        def drain(proc: Proc) -> None:
            out, err = proc.popen.communicate()
            proc.stdout, proc.stderr = out or "", err or ""
            proc.ended = time.monotonic()

        threads = [threading.Thread(target=drain, args=(p,), daemon=True) for p in self.procs if p.ended is None]
        for t in threads:
            t.start()
        until = time.monotonic() + timeout
        while any(t.is_alive() for t in threads) and time.monotonic() < until:
            self._watch()
            time.sleep(0.05)
        if any(t.is_alive() for t in threads):
            self.kill_all()
            for t in threads:
                t.join(5)
            pytest.fail(f"processes still running after {timeout}s: {[p.popen.args for p in self.procs if p.rc is None]}")
        return self.procs

    def kill_all(self) -> None:
        self._watch()
        for pid in sorted(self.seen):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def alive(self) -> list[int]:
        out = []
        for pid in sorted(self.seen):
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
            except psutil.NoSuchProcess:
                pass
        return out

    def assert_no_orphans(self, grace_s: float = 3.0) -> None:
        until = time.monotonic() + grace_s
        while self.alive() and time.monotonic() < until:
            time.sleep(0.05)
        assert not self.alive(), f"processes left behind: {self.alive()}"


@pytest.fixture
def procs():
    tracker = Procs()
    yield tracker
    tracker.kill_all()


def by_name(report: dict, name: str) -> list[dict]:
    return [c for c in report["checks"] if c["name"] == name]


def findings(report: dict, finding_id: str) -> list[dict]:
    return [f for f in report["findings"] if f["id"] == finding_id]


def diagnostics(proc: Proc) -> str:
    """What to show when an assertion about a process fails: its verdict first, then its output."""
    lines = [f"rc={proc.rc} after {proc.elapsed:.1f}s"]
    try:
        for report in proc.reports():
            lines.append(f"report: {report['status']} world={report['world']} duration={report['duration_s']}")
            lines += [f"  {f['id']} {f['title']} ranks={f['ranks']}" for f in report["findings"]]
            lines += [f"  check {c['name']} {c['status']} ranks={c.get('ranks')} {c.get('reason', '')}"
                      for c in report["checks"] if c["status"] != "pass"]
    except ValueError:
        lines.append(f"--- stdout\n{proc.stdout[-4000:]}")
    lines.append(f"--- stderr\n{proc.stderr[-3000:]}")
    return "\n".join(lines)
