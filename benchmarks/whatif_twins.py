"""The slow-rank what-if against the job itself: a DDP loop with one rank's reads slower, and its balanced twin.

    python benchmarks/whatif_twins.py [--steps 800] [--extra 4] [--jitters 0,4] [--worlds 2,4] [--json]

Each case runs a DDP loop (gloo, CPU, a small model) whose every step reads a batch from "storage": a sleep of
15 ms plus, on every rank, its own jitter (uniform 0-2J ms, drawn per read from a seed of its own), plus on rank 1
`--extra` ms. The balanced twin is the same loop without the extra. Both run under `distdoctor guard --slow on`
(window 10 s), one after the other. Printed per case: the cost the guard named (what the least-waiting other rank
waits more than rank 1, per step), the step it says the job would save without rank 1 (the what-if), and what the
twin's steps really were shorter (rank 0's mean step, the first 50 steps left out): the what-if is right when it
matches that, the cost is an upper bound of it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WARMUP = 50

JOB = """\
import json, os, random, sys, time
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

extra_s, jitter_s, steps, out = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3, int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo")
rank = dist.get_rank()
rng = random.Random(1000 + rank)
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
times = []
for step in range(steps):
    start = time.perf_counter()
    time.sleep(0.015 + rng.uniform(0.0, 2 * jitter_s) + (extra_s if rank == 1 else 0.0))  # the read
    x, y = torch.randn(32, 64), torch.randn(32, 16)
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    times.append(time.perf_counter() - start)
if rank == 0:
    with open(out, "w") as f:
        json.dump(times, f)
dist.destroy_process_group()
"""


def run(root: Path, name: str, world: int, extra_ms: float, jitter_ms: float, steps: int) -> dict:
    job, report, times = root / "job.py", root / f"reports-{name}", root / f"times-{name}.json"
    job.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTDOCTOR_", "TORCHELASTIC_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "distdoctor", "guard", "--slow", "on", "--slow-window", "10", "--report-dir",
           str(report), "--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(world), str(job), str(extra_ms), str(jitter_ms), str(steps), str(times)]
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    step_ms = statistics.mean(json.loads(times.read_text())[WARMUP:]) * 1e3 if times.exists() else None
    found = [json.loads(p.read_text()) for p in report.glob("distdoctor-guard-slow-rank0-*.json")]
    named = [f for r in found for f in r["findings"] if f["id"] in ("slow.W001", "slow.W002")]
    return {"name": name, "code": out.returncode, "step_ms": step_ms, "findings": [f["id"] for r in found for f in r["findings"]],
            "data": named[0]["data"] if named else None, "tail": (out.stdout + out.stderr)[-2000:] if out.returncode else ""}


def case(root: Path, world: int, extra_ms: float, jitter_ms: float, steps: int) -> dict:
    slow = run(root, f"slow-{world}-{jitter_ms}", world, extra_ms, jitter_ms, steps)
    twin = run(root, f"twin-{world}-{jitter_ms}", world, 0.0, jitter_ms, steps)
    data = slow["data"] or {}
    gain = slow["step_ms"] - twin["step_ms"] if slow["step_ms"] and twin["step_ms"] else None
    return {"world": world, "extra_ms": extra_ms, "jitter_ms": jitter_ms, "named": slow["findings"],
            "twin_said": twin["findings"], "slow_ranks": data.get("slow"), "cost_ms": data.get("cost_ms_per_step"),
            "saved_ms": data.get("saved_ms_per_step"), "twin_gain_ms": gain, "step_ms": slow["step_ms"],
            "twin_step_ms": twin["step_ms"], "codes": [slow["code"], twin["code"]], "tails": [slow["tail"], twin["tail"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--extra", type=float, default=4.0, help="rank 1's extra read, ms")
    parser.add_argument("--jitters", default="0,4", help="each rank's read jitter J (uniform 0-2J ms), a list")
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in (int(w) for w in args.worlds.split(",")):
            for jitter in (float(j) for j in args.jitters.split(",")):
                rows.append(case(Path(tmp), world, args.extra, jitter, args.steps))
                if not args.json:
                    r = rows[-1]
                    print(f"ranks {world}, jitter 0-{2 * jitter:g} ms: named {r['named']} ranks {r['slow_ranks']}; cost "
                          f"{r['cost_ms']} ms, what-if {r['saved_ms']} ms; the twin's steps shorter by "
                          f"{r['twin_gain_ms'] and round(r['twin_gain_ms'], 2)} ms ({r['step_ms'] and round(r['step_ms'], 1)}"
                          f" against {r['twin_step_ms'] and round(r['twin_step_ms'], 1)}); the twin said {r['twin_said']}"
                          + "".join(f"\n{t}" for t in r["tails"] if t), flush=True)
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
