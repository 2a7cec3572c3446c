"""Real faults on this machine: each test produces the fault, runs the local stage in a fresh
process and checks the cause, the remediation, the time taken and a clean stderr."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.conftest import deadline_bound, recent_startup_s

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# "Within a few seconds": the local stage itself takes about one torch import; the bound leaves
# room for a loaded 2-core machine, and is far below torch's own 600-1800 s.
DEADLINE_S = 15.0

_LAUNCH_PREFIXES = ("DISTDOCTOR_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "JSM_", "PET_",
                    "NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_FR_")
_LAUNCH_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GROUP_RANK", "ROLE_RANK", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "KUBERNETES_SERVICE_HOST", "LSB_JOBID")


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_PREFIXES) and k not in _LAUNCH_NAMES}
    env.update(extra)
    return env


@dataclass
class Outcome:
    returncode: int
    report: dict
    stderr: str
    elapsed: float

    def findings(self, cause: str | None = None, id: str | None = None) -> list[dict]:
        return [f for f in self.report["findings"] if (cause is None or f["cause"] == cause) and (id is None or f["id"] == id)]

    def one(self, cause: str) -> dict:
        found = self.findings(cause)
        assert found, f"no {cause} finding; got {[(f['id'], f['cause'], f['title']) for f in self.report['findings']]}"
        return found[0]


def run(cmd: list[str], env: dict[str, str], preexec=None) -> Outcome:
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=60, preexec_fn=preexec)
    elapsed = time.monotonic() - start
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 1), f"exit {proc.returncode}: {proc.stderr}"
    report = json.loads(proc.stdout)
    assert not [f for f in report["findings"] if f["id"].startswith("core.")], report["findings"]
    assert elapsed < deadline_bound(DEADLINE_S), f"took {elapsed:.1f}s"
    return Outcome(proc.returncode, report, proc.stderr, elapsed)


def check_local(env: dict[str, str], *extra: str, preexec=None, prefix: list[str] | None = None) -> Outcome:
    """`distdoctor check --stage local --format json` in a fresh process."""
    # Each check's own bound (10 s by default) grows with the measured start-up: on a loaded machine a
    # check that imports torch's backends can take longer than that, and would be reported as unknown.
    check_timeout = f"{10.0 + 2 * recent_startup_s():.0f}"  # timed in the last two minutes: load comes in bursts
    cmd = [*(prefix or []), sys.executable, "-m", "distdoctor", "check", "--stage", "local", "--format", "json",
           "--check-timeout", check_timeout, *extra]
    return run(cmd, env, preexec)


def engine_local(env: dict[str, str], *argv: str) -> Outcome:
    """The engine with real probes (fake GPUs when DISTDOCTOR_TEST_FAKE_GPUS is set) and this argv."""
    return run([sys.executable, str(HERE / "run_engine.py"), *argv], env)


@pytest.fixture
def spawn():
    """Start helper processes; they are killed (by PID) when the test ends, pass or fail."""
    procs: list[subprocess.Popen] = []

    def start(args: list[str], ready_port: int | None = None, **kw) -> subprocess.Popen:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
        procs.append(proc)
        if ready_port is not None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    with socket.create_connection(("127.0.0.1", ready_port), timeout=0.2):
                        return proc
                except OSError:
                    if proc.poll() is not None:
                        raise RuntimeError(f"{args} exited with {proc.returncode}")
                    time.sleep(0.05)
            raise RuntimeError(f"{args} did not listen on {ready_port}")
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
