"""The guard's backstop after a group's timeout (policy.grace_s) is longer than torch takes to end the
collective itself: gloo's overshoot measured on the installed torch, NCCL's from its watchdog's source."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from guard_torchrun import LAUNCHER_VARS

from distdoctor.core.findings import Finding, Severity
from distdoctor.embedded.guard import policy

SCRIPT = Path(__file__).resolve().parents[2] / "compat" / "jobs" / "timeout_job.py"  # the compat matrix runs it too


@pytest.mark.multiproc
def test_gloo_raises_at_its_timeout_well_inside_the_guards_grace(tmp_path):
    """Rank 1's all_reduce, recv and barrier in groups with a 2 s timeout that rank 0 never joins: each
    raises at least 2 s after its call (torch never ends it early) and less than half the guard's gloo
    grace after that (measured 5-24 ms on torch 2.13 at load 5-10 on 2 cores)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith(("DISTDOCTOR_", "TORCH"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT), "2"]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    overshoot = {op: float(s) for op, s in re.findall(r"OVERSHOOT (\w+) (-?[\d.]+)", out)}
    assert set(overshoot) == {"all_reduce", "recv", "barrier"}, out[-4000:]
    grace = policy.grace_s("gloo")
    for op, seconds in overshoot.items():
        assert 0 <= seconds < grace / 2, (op, seconds, grace)


def test_the_grace_per_backend_covers_what_torch_takes_to_end_a_timed_out_collective():
    # NCCL (ProcessGroupNCCL.cpp): a watchdog pass every 10 s (torch 2.1; 100 ms from 2.2), then up to
    # TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC for the flight recorder's dump (60 s by default in some releases).
    assert policy.grace_s("nccl") >= 10 + 60
    assert policy.grace_s("nccl", {"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "300000"}) >= 300 + 10
    assert policy.grace_s("gloo") >= 1.0
    # A backend not known (mpi, ucc, a plugin's) or a group whose backend could not be read: the largest.
    assert policy.grace_s("ucc") == policy.grace_s(None) == max(policy.GRACE_BY_BACKEND.values())


def test_a_watched_stall_is_ended_only_after_the_groups_timeout_and_its_backends_grace():
    late = Finding(id="job.E002", severity=Severity.ERROR, cause="straggler_rank", title="late")
    for backend in ("gloo", "nccl"):
        grace = policy.grace_s(backend)
        watched = policy.judge([late], "auto", world_known=True, stall_since_at=1000.0, group_timeout_s=30.0,
                               now_at=1029.0 + grace, grace=grace)
        assert watched.action == policy.WATCH and watched.deadline_at == 1030.0 + grace
        ended = policy.judge([late], "auto", world_known=True, stall_since_at=1000.0, group_timeout_s=30.0,
                             now_at=1030.0 + grace, grace=grace)
        assert ended.action == policy.END
        # A stall that cleared at the group's timeout was torch's end; one that cleared earlier was the rank's.
        assert policy.ended_by_torch(watched.deadline_at, [], now_at=1030.0, grace=grace)
        assert not policy.ended_by_torch(watched.deadline_at, [], now_at=1020.0, grace=grace)
