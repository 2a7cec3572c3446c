"""`distdoctor bench`: a rank that cannot hand its figures to rank 0 prints its own report.

Real processes on loopback: rank 1 started alone against a port where nothing listens, and rank 1
whose rank 0 is killed in the middle of the measurements (rank 0 hosted the store: it goes too).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import deadline_bound, free_port, json_objects, measured_startup_s

pytestmark = pytest.mark.multiproc


def rank_cmd(rank: int, port: int, timeout: float, *extra: str) -> list[str]:
    return [sys.executable, "-m", "distdoctor", "bench", "--rank", str(rank), "--world-size", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(port), "--timeout", str(timeout), "--format", "json",
            *extra]


def clean_env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("TORCHELASTIC_", "SLURM_"))}


def start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen, bound: float) -> tuple[str, str, int | None]:
    try:
        out, err = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=10)
    return out, err, proc.returncode


def one_own_report(out: str, err: str) -> dict:
    assert "Traceback" not in err, err[-3000:]
    reports = json_objects(out)
    assert len(reports) == 1, f"{len(reports)} reports\n{out[-2000:]}\n{err[-2000:]}"
    assert 1 in reports[0]["world"]["ranks_reported"], reports[0]["world"]
    return reports[0]


def test_bench_rank_1_alone_with_nothing_listening_prints_its_own_report():
    timeout = round(5 + 2 * measured_startup_s())  # its work, after torch's start-up on this machine now
    proc = start(rank_cmd(1, free_port(), timeout))
    out, err, code = finish(proc, deadline_bound(timeout) + 30)
    assert code == 1, out[-2000:] + err[-2000:]
    report = one_own_report(out, err)
    severe = [f for f in report["findings"] if f["severity"] in ("error", "critical")]
    assert severe and severe[0]["ranks"] == [1], report["findings"]


def test_bench_rank_1_whose_rank_0_is_killed_mid_run_prints_its_own_report():
    # Long enough for torch to start on a loaded machine; 1000 warm-ups of 64 MiB outlast it.
    timeout = round(15 + 2 * measured_startup_s())
    port = free_port()
    long_run = ("--sizes", "64M", "--warmup", "1000", "--no-links")
    rank0, rank1 = start(rank_cmd(0, port, timeout, *long_run)), start(rank_cmd(1, port, timeout, *long_run))
    try:
        time.sleep(timeout / 2)  # both are measuring by then (or, on a very slow machine, checking in)
        os.killpg(rank0.pid, signal.SIGKILL)
        out, err, code = finish(rank1, deadline_bound(timeout, 2.0) + 30)
    finally:
        for proc in (rank0, rank1):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
    assert code in (1, 3), out[-2000:] + err[-2000:]
    one_own_report(out, err)
