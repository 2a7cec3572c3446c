"""Run a script under `distdoctor guard -- python -m torch.distributed.run ...` the way a user would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def line_of(script: Path, tag: str) -> str:
    for number, text in enumerate(script.read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# LINE:{tag}"):
            return f"{script}:{number}"  # the jobs run in tmp_path: the guard shows the full path
    raise AssertionError(tag)


def guarded_run(script: Path, args: list[str], tmp_path: Path, *options: str, nproc: int = 2, timeout: float = 120,
                env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``script`` under torch's launcher via `distdoctor guard`; (result, seconds)."""
    cmd = [sys.executable, "-m", "distdoctor", "guard", "--report-dir", str(tmp_path), *options, "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           str(script), *args]
    started = time.monotonic()
    # Launched once and judged as it ends: a run that aborts at exit is a failure of the guard's
    # (benchmarks/exit_abort.py counts aborts at exit beside plain torch's).
    result = launch(cmd, tmp_path, timeout, env)
    return result, time.monotonic() - started


def launch(cmd: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a launcher line in a session of its own with a clean launcher environment; every process it
    started is killed at the end (and the test fails if it ran past ``timeout``)."""
    base = {k: v for k, v in os.environ.items()
            if k not in LAUNCHER_VARS and not k.startswith(("DISTDOCTOR_", "TORCHELASTIC_", "TORCH_FR_"))}
    base.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), **(env or {})})
    proc = subprocess.Popen(cmd, env=base, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd[:4])} did not end within {timeout} s:\n{out[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher's workers, if any outlived it
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def reports(tmp_path: Path, kind: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob(f"distdoctor-guard-{kind}-rank*.json"))]
