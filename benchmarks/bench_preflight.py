"""preflight(model)'s cost on 2 ranks, against the bare torchrun script, and how it grows.

    python benchmarks/bench_preflight.py               # 5 runs per figure, human-readable
    python benchmarks/bench_preflight.py --repeats 9
    python benchmarks/bench_preflight.py --quick       # 1 run, small sizes: checks it runs
    python benchmarks/bench_preflight.py --json        # the figures as JSON (benchmarks/run.py)

Figures (medians of interleaved runs, see timing.py):
- whole job, small model: ``torchrun --standalone --nproc-per-node 2`` of a script that inits
  gloo, calls ``distdoctor.preflight(model=...)`` (with its local registry checks) and runs one
  all_reduce, against ``bare_allreduce.py`` (init gloo, one all_reduce). Target <= 1.10x.
- whole job, large model: the same with a model of many tensors, against the same script
  without the preflight call (building the model is not preflight's cost).
- in-script growth: inside one 2-rank job, the median time of preflight() (exchange and
  fingerprints; local checks off) for models of 10 ... 10,000 parameter tensors, next to the
  time of ``all_gather_object`` of the full encoded spec tables, the obvious one-collective
  alternative (this is the measurement behind preflight's exchange design).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from timing import PYTHON, Figure, clean_env, interleaved, timed  # noqa: E402

TARGET = "<= 1.10x"
SMALL_TENSORS = 4


def torchrun(*args: str) -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]


# -- the child: runs inside each rank ----------------------------------------------------------


def build(tensors: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers = max(1, tensors // 2)  # a Linear layer has 2 tensors
    return nn.Sequential(*[nn.Linear(64, 64) for _ in range(layers)]) if tensors > SMALL_TENSORS else \
        nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 1))


def child_job(tensors: int, with_preflight: bool) -> None:
    """The subject job: init gloo, (preflight,) one all_reduce, tear down."""
    import torch
    import torch.distributed as dist

    import distdoctor

    dist.init_process_group("gloo")
    model = build(tensors)
    if with_preflight:
        distdoctor.preflight(model=model, timeout=60)
    tensor = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(tensor)
    if tensor.tolist() != [3.0] * 4:
        raise SystemExit(f"all_reduce gave {tensor.tolist()}")
    dist.destroy_process_group()


def child_sweep(sizes: list[int], repeats: int) -> None:
    """In one job: preflight() and all_gather_object(spec table) per model size; rank 0 prints JSON."""
    import torch.distributed as dist

    import distdoctor
    from distdoctor.embedded.setup_checks import model_spec_table
    from distdoctor.checks._support.tensor_specs import DEFAULT_MAX_SAMPLES

    dist.init_process_group("gloo")
    rows = []
    for size in sizes:
        model = build(size)
        n_tensors = sum(1 for _ in model.parameters())
        n_params = sum(p.numel() for p in model.parameters())
        distdoctor.preflight(model=model, timeout=120, local_checks=False)  # warm-up
        pre, obj, spec = [], [], []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            distdoctor.preflight(model=model, timeout=120, local_checks=False)
            pre.append(time.perf_counter() - t0)
            dist.barrier()
            t0 = time.perf_counter()
            table = model_spec_table(model, DEFAULT_MAX_SAMPLES)
            spec.append(time.perf_counter() - t0)
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, table.encode())
            obj.append(time.perf_counter() - t0)
        encoded = len(json.dumps(table.encode()))
        rows.append({"tensors": n_tensors, "params": n_params, "preflight_s": statistics.median(pre),
                     "fingerprint_s": statistics.median(spec), "all_gather_object_s": statistics.median(obj),
                     "table_bytes": encoded, "runs_s": pre})
    # local registry checks, once (they cost the same whatever the model)
    t0 = time.perf_counter()
    distdoctor.preflight(model=build(SMALL_TENSORS), timeout=60, local_checks=True)
    with_checks = time.perf_counter() - t0
    if dist.get_rank() == 0:
        print("SWEEP " + json.dumps({"rows": rows, "small_with_local_checks_s": with_checks}))
    dist.destroy_process_group()


# -- the parent: figures -----------------------------------------------------------------------


def figures(repeats: int, quick: bool) -> tuple[list[Figure], dict]:
    env = clean_env()
    me = str(Path(__file__).resolve())
    large = 200 if quick else 2000
    sizes = [10, 100] if quick else [10, 100, 1000, 10000]

    def job(tensors: int, with_preflight: bool):
        return lambda: _checked(timed(torchrun(me, "--child-job", str(tensors), "1" if with_preflight else "0"),
                                      env=env, bound=300))

    def bare():
        return _checked(timed(torchrun(str(HERE / "bare_allreduce.py")), env=env, bound=300))

    out: list[Figure] = []
    subj, base = interleaved(job(SMALL_TENSORS, True), bare, repeats, warmup=not quick)
    out.append(Figure.from_runs(
        "preflight", f"torchrun 2 ranks: init gloo + preflight(model, {SMALL_TENSORS} tensors, local checks on) "
        "+ all_reduce", subj, "torchrun 2 ranks: bare_allreduce.py (init gloo + all_reduce)", base, TARGET))
    subj, base = interleaved(job(large, True), job(large, False), repeats, warmup=not quick)
    out.append(Figure.from_runs(
        "preflight", f"same job, model of {large} tensors", subj,
        f"the same job without the preflight call ({large}-tensor model built)", base, TARGET))

    sweep_run = _checked(timed(torchrun(me, "--child-sweep", ",".join(map(str, sizes)), str(max(3, repeats))),
                               env=env, bound=600))
    line = next(l for l in sweep_run.stdout.splitlines() if l.startswith("SWEEP "))
    sweep = json.loads(line[len("SWEEP "):])
    for row in sweep["rows"]:
        out.append(Figure(
            "preflight", f"in-script preflight(), {row['tensors']} tensors / {row['params']:,} params (2 ranks)",
            row["preflight_s"], [round(r, 5) for r in row["runs_s"]],
            "spec table + all_gather_object of the full tables", row["all_gather_object_s"], [],
            row["preflight_s"] / row["all_gather_object_s"] if row["all_gather_object_s"] else None, "", "",
            f"fingerprints alone {row['fingerprint_s'] * 1000:.1f} ms; encoded table {row['table_bytes'] / 1024:.0f} KiB"))
    return out, sweep


def _checked(run):
    if run.code != 0:
        raise SystemExit(f"a measured job failed (exit {run.code}): {(run.stderr or run.stdout)[-800:]}")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child-job", nargs=2, metavar=("TENSORS", "PREFLIGHT"), help=argparse.SUPPRESS)
    parser.add_argument("--child-sweep", nargs=2, metavar=("SIZES", "REPEATS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_job:
        child_job(int(args.child_job[0]), args.child_job[1] == "1")
        return
    if args.child_sweep:
        child_sweep([int(s) for s in args.child_sweep[0].split(",")], int(args.child_sweep[1]))
        return
    repeats = 1 if args.quick else args.repeats
    figs, sweep = figures(repeats, args.quick)
    if args.json:
        print(json.dumps([f.to_dict() for f in figs]))
        return
    print(f"preflight on 2 ranks (gloo, loopback), {repeats} run(s) per median, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"{'subject':<78} {'median':>9} {'baseline':>9} {'ratio':>7}  target")
    for f in figs[:2]:
        print(f"{f.subject[:78]:<78} {f.median_s:>8.3f}s {f.baseline_median_s:>8.3f}s {f.ratio:>6.3f}x  {f.target}")
    print()
    print("growth with the number of parameter tensors (in-script, local checks off; medians):")
    print(f"{'tensors':>8} {'params':>12} {'preflight':>11} {'fingerprint':>12} {'all_gather_object':>18} "
          f"{'ratio':>7} {'table':>9}")
    for row in sweep["rows"]:
        print(f"{row['tensors']:>8} {row['params']:>12,} {row['preflight_s'] * 1000:>9.1f}ms "
              f"{row['fingerprint_s'] * 1000:>10.1f}ms {row['all_gather_object_s'] * 1000:>16.1f}ms "
              f"{row['preflight_s'] / row['all_gather_object_s']:>6.2f}x {row['table_bytes'] / 1024:>7.0f}KiB")
    print(f"small model with the local registry checks on: {sweep['small_with_local_checks_s'] * 1000:.1f} ms")


if __name__ == "__main__":
    main()
