"""nanoGPT's train.py, unmodified, on 2 CPU ranks under `distdoctor guard --`: rank 1 given twice the batch, and its balanced twin.

    python benchmarks/nanogpt_slow.py --nanogpt PATH/TO/nanoGPT [--iters 300] [--window 10] [--json]

PATH is a copy of github.com/karpathy/nanoGPT (not part of this repository). The script writes, in a
temporary directory, fake token data (numpy, a 256-token vocabulary: data/<dir>/train.bin, val.bin,
meta.pkl) and a config file that reads RANK (rank 1's batch_size twice the others' in the slow run), and
runs `python -m distdoctor guard --slow on --report-dir DIR -- python -m torch.distributed.run --standalone
--nproc-per-node 2 train.py CONFIG` from PATH (train.py reads configurator.py from its working directory),
gloo, a tiny model, no compile. nanoGPT's DDP set-up picks `cuda:<local rank>` whatever --device says and
wraps the model with device_ids: on a machine without a GPU the config makes `torch.cuda.set_device` put
the device back to cpu, and train.py's DDP name a DDP without device_ids (the config runs in its globals).

Printed: the guard's live lines and its verdict at the end of each run, rank 0's median iteration time in
each run (nanoGPT's own "iter N: ... time X ms" lines, the first 10 left out), and the cost and the what-if the
guard named against the difference of the two runs' iteration times: what the job would gain without the extra
batch.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

CONFIG = """\
import os, sys, torch
# nanoGPT's DDP set-up sets device = f'cuda:{{ddp_local_rank}}'; on a CPU machine, back to cpu
def _cpu_device(_device):
    sys._getframe(1).f_globals['device'] = 'cpu'
if not torch.cuda.is_available():
    torch.cuda.set_device = _cpu_device
    _DDP = DDP  # train.py's own name: it wraps the model with device_ids=[local rank], which a CPU module refuses
    def DDP(module, device_ids=None, **kwargs):
        return _DDP(module, **kwargs)
out_dir = {out!r}
dataset = {data!r}
device = 'cpu'
compile = False
backend = 'gloo'
dtype = 'float32'
n_layer, n_head, n_embd, block_size, dropout, bias = 2, 2, 64, 64, 0.0, False
batch_size = {batch} * ({factor} if int(os.environ.get('RANK', 0)) == 1 else 1)  # rank 1's batch
gradient_accumulation_steps = 2
max_iters = {iters}
eval_interval = {eval_interval}
eval_iters = 5
log_interval = 5
always_save_checkpoint = False
wandb_log = False
decay_lr = False
learning_rate = 1e-3
"""


def write_data(root: Path) -> Path:
    import numpy as np

    data = root / "fake"
    data.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, size in (("train", 400_000), ("val", 40_000)):
        rng.integers(0, 256, size, dtype=np.uint16).tofile(data / f"{split}.bin")
    (data / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 256}))
    return data


def run(nanogpt: Path, root: Path, name: str, factor: int, iters: int, window: float, batch: int) -> dict:
    report = root / f"reports-{name}"
    config = root / f"config_{name}.py"
    config.write_text(CONFIG.format(out=str(root / f"out-{name}"), data=str(root / "fake"), batch=batch, factor=factor,
                                    iters=iters, eval_interval=iters + 1))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTDOCTOR_", "TORCHELASTIC_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", DISTDOCTOR_GUARD_SLOW="on",
               DISTDOCTOR_GUARD_SLOW_WINDOW=str(window))
    cmd = [sys.executable, "-m", "distdoctor", "guard", "--report-dir", str(report), "--", sys.executable, "-m",
           "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "train.py", str(config)]
    out = subprocess.run(cmd, cwd=nanogpt, env=env, capture_output=True, text=True, timeout=1800)
    text = out.stdout + out.stderr
    times = [float(m) for m in re.findall(r"^iter \d+: loss [\d.]+, time ([\d.]+)ms", text, re.M)]
    said = [line for line in text.splitlines() if line.startswith("distdoctor guard (rank 0)") or
            re.match(r"^\s+(slow\.|where:|why:|waits per|it arrives|fix:)", line)]
    found = [json.loads(p.read_text()) for p in report.glob("distdoctor-guard-slow-rank0-*.json")]
    findings = [f for r in found for f in r["findings"]]
    return {"name": name, "code": out.returncode, "iter_ms": statistics.median(times[2:]) if len(times) > 3 else None,
            "said": said, "findings": findings, "tail": text[-3000:] if out.returncode else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nanogpt", type=Path, required=True, help="a copy of github.com/karpathy/nanoGPT")
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not (args.nanogpt / "train.py").is_file() or not (args.nanogpt / "configurator.py").is_file():
        parser.error(f"{args.nanogpt}: not a nanoGPT copy (no train.py and configurator.py)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_data(root)
        slow = run(args.nanogpt, root, "slow", 2, args.iters, args.window, args.batch)
        twin = run(args.nanogpt, root, "balanced", 1, args.iters, args.window, args.batch)
    named = [f for f in slow["findings"] if f["id"] in ("slow.W001", "slow.W002")]
    cost = named[0]["data"]["cost_ms_per_step"] if named else None
    saved = named[0]["data"].get("saved_ms_per_step") if named else None
    gained = slow["iter_ms"] - twin["iter_ms"] if slow["iter_ms"] and twin["iter_ms"] else None
    result = {"slow": slow, "balanced": twin, "named_cost_ms_per_step": cost, "named_saved_ms_per_step": saved,
              "iteration_gain_ms": gained}
    if args.json:
        print(json.dumps(result))
        return
    for case in (slow, twin):
        print(f"== {case['name']}: exit code {case['code']}, rank 0's median iteration {case['iter_ms']} ms")
        print("\n".join(case["said"]) or "(the guard said nothing)")
        if case["tail"]:
            print(case["tail"])
    print(f"== the cost named: {cost} ms per step, the what-if {saved} ms per step; the balanced twin's iterations are "
          f"{gained and round(gained, 1)} ms shorter (nanoGPT's own times, rank 0)")


if __name__ == "__main__":
    main()
