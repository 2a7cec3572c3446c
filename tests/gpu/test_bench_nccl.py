"""`distdoctor bench` on NCCL: device buffers, CUDA-event timing, correct results (needs CUDA and 2 GPUs)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.device_count() >= 2 and torch.distributed.is_nccl_available()),
    reason="needs CUDA, NCCL and at least 2 GPUs",
)

TIMEOUT_S = 120


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distdoctor", "bench", "--nproc", "2", "--timeout", str(TIMEOUT_S),
                           "--format", "json", *args], capture_output=True, text=True, timeout=TIMEOUT_S + 60)


def test_nccl_sweep_and_link_matrix_on_two_gpus():
    out = bench("--sizes", "8:128M:8", "--iters", "10", "--warmup", "2")  # 8 B, 64 B ... 16M, 128M
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(out.stdout)
    data = report["data"]["bench"]
    assert data["backend"] == "nccl"  # chosen by itself: every rank has its GPU
    rows = data["sweep"]
    assert {r["op"] for r in rows} == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"}
    print("\nbusbw on 2 GPUs (GB/s):")
    for r in rows:
        print(f"  {r['op']:<15} {r['size']:>5}  time {r['time_us']:>10.2f} us  busbw {r['busbw_gbs']:.3f}")
        assert r["correct"] and r["time_us"] > 0
    # Large messages over NVLink or PCIe move far faster than any loopback socket (> 1 GB/s).
    big = [r for r in rows if r["op"] == "all_reduce" and r["bytes"] == 128 * 2**20]
    assert big and all(r["busbw_gbs"] > 1.0 for r in big)
    (pair,) = data["links"]["pairs"]
    assert pair["bytes"] == 4 * 2**20 and pair["bw_gbs"] > 1.0 and pair["lat_us"] > 0


def test_nccl_can_be_asked_for_and_gloo_still_runs_on_the_same_gpus():
    out = bench("--backend", "gloo", "--sizes", "8,64K", "--ops", "all_reduce", "--no-links")
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout)["data"]["bench"]["backend"] == "gloo"
