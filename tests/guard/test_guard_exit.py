"""A guarded job that ends while the guard's threads are busy ends as it would without the guard: SIGTERM to
the launcher in the guard's first seconds (its store client being opened), the ranks exiting gracefully."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guard_torchrun import LAUNCHER_VARS, REPO

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]
SCRIPT = Path(__file__).with_name("scripts") / "graceful_job.py"


def test_sigterm_to_the_launcher_while_the_guards_client_opens_ends_the_ranks_without_an_abort(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith(("DISTDOCTOR_", "TORCHELASTIC_", "TORCH_FR_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "distdoctor", "guard", "--report-dir", str(tmp_path / "reports"), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT),
           str(tmp_path)]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not all((tmp_path / f"up{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all((tmp_path / f"up{r}").exists() for r in (0, 1)), "the ranks did not start"
        time.sleep(0.5)  # the guard's first poll, and its client's connect, come within its first interval (2 s)
        proc.send_signal(signal.SIGTERM)  # `distdoctor guard --` exec'd the launcher: this is torchrun
        out, _ = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert "terminate called" not in out and "exitcode: -6" not in out.replace("exitcode  :", "exitcode:"), out[-4000:]
    assert str(REPO / "distdoctor") not in out, out[-4000:]  # no traceback through distdoctor's code (torchrun's own is expected)
    assert "guard.W012" not in out, out[-4000:]
