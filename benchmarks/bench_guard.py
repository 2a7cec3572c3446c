"""The runtime guard's cost in a real DDP training loop, and the time from a hang to its named cause.

    python benchmarks/bench_guard.py               # 7 launches per mode, 10,000 steps each, and one fully guarded (~15 min)
    python benchmarks/bench_guard.py --quick       # 1 launch per mode, fewer steps: checks it runs
    python benchmarks/bench_guard.py --json        # the figures as JSON (benchmarks/run.py)

Figures:
- step time: the pytorch/examples DDP tutorial's loop (ToyModel: Linear(10, 10), ReLU,
  Linear(10, 5); SGD; MSE on a batch of 20) on 2 ranks, CPU, gloo, under
  ``torch.distributed.run --standalone``, with the usual per-step ``all_reduce`` of the loss for
  logging. Inside one launch, blocks of 10 steps alternate between torch's all_reduce and the
  guarded one (side by side in one run, so the machine's load hits both alike); each launch
  gives the ratio of the mean step times with and without the guard, verified steps included;
  the figure is the median over launches. Launches with ``distdoctor.guard()`` (defaults) and
  with ``distdoctor.guard(verify="all")``. Target for the defaults: <= 1.03x.
  The method's floor comes from the same launches: the unguarded blocks against each other
  (blocks 2, 6, 10, ... over 0, 4, 8, ...), 1.000x without noise. The guard's start-up (its
  first verify_first collectives are all verified, once per run) runs in guarded warm-up steps
  after torch's own and is given apart: the extra time of those steps over unguarded ones.
  The guard sees only every other block, so the time it measures between its calls is twice
  the step, and at the default budget it would verify twice as often per guarded step as in a
  fully guarded job. The launches with the defaults therefore give it half the default
  verify_budget: per guarded call it then verifies as often as a fully guarded job does at the
  default. Checked in every run: one launch guards every step at the true default
  (mode "whole"), and both verified fractions are printed side by side.
  DDP's own gradient all-reduces run in C++ and are not wrapped; the guard counts them through
  torch's flight recorder, which records them whether the guard runs or not (torch 2.13's
  buffer default is 2,000 entries, the size `distdoctor guard --` sets). What the guard adds for
  them is its watchdog thread's poll: measured on its own (per poll, 4 polls a second), since it
  runs during both halves of the blocks.
- hang to cause: `distdoctor guard --hang-timeout 2 --on-hang exit -- torchrun ...` on the same DDP loop; rank 1
  sleeps before step 3 while rank 0 waits in loss.backward()'s all-reduce; from rank 1 starting
  to sleep to the guard's JSON report on disk (and to the launcher's exit). Target:
  hang_timeout + 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from timing import PYTHON, REPO, Figure, clean_env, timed  # noqa: E402

from distdoctor.embedded.guard import GuardSettings  # noqa: E402

STEP_TARGET = "<= 1.03x"
HANG_TIMEOUT_S = 2.0
WARMUP_STEPS = 20
VERIFY_FIRST = 8  # guard()'s verify_first: the calls every run verifies before sampling
BLOCK = 10


def torchrun(*args: str) -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]


# -- the children: run inside each rank -------------------------------------------------------------


def child_train(mode: str, steps: int, batch: int = 20) -> None:
    """The DDP tutorial's loop, in blocks with and without the guard; rank 0 prints the step times."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import distdoctor

    dist.init_process_group("gloo")
    # "default": the blocks halve the pace the guard measures; half the budget undoes that (above).
    budget = GuardSettings.verify_budget / 2 if mode == "default" else None
    g = distdoctor.guard(verify="all" if mode == "all" else None, verify_budget=budget)
    guarded = dist.all_reduce
    original = guarded.__distdoctor_original__
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)))
    loss_fn, optimizer = nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.001)
    times: dict[bool, list[float]] = {True: [], False: []}
    floor: dict[bool, list[float]] = {True: [], False: []}  # the unguarded blocks, split in two by turn
    startup: list[float] = []
    verified = 0
    # Torch's own warm-up (unguarded), then the guard's start-up (guarded: the first verify_first
    # collectives of a group are all verified, once per run), then the measured blocks.
    for step in range(2 * WARMUP_STEPS + steps):
        measured = step - 2 * WARMUP_STEPS
        # Blocks of steps alternate between torch's all_reduce and the guarded one (the same
        # schedule on both ranks), so the machine's load drifts over both alike. The guard's
        # sequence numbers only count guarded calls: its sampling runs as in a real job.
        block = measured // BLOCK
        on = step >= WARMUP_STEPS if measured < 0 else (block % 2 == 1 or mode == "whole")
        dist.all_reduce = guarded if on else original
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(model(torch.randn(batch, 10)), torch.randn(batch, 5))
        loss.backward()
        optimizer.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)  # the loss averaged for logging, as training scripts do
        took = time.perf_counter() - start
        if measured >= 0:
            times[on].append(took)
            verified += on and g.recorder.ring[-1].verified
            if not on:
                floor[block % 4 == 2].append(took)
        elif on:
            startup.append(took)
    dist.all_reduce = guarded
    dist.barrier()
    if dist.get_rank() == 0 and mode == "whole":
        print(json.dumps({"on_mean_s": statistics.fmean(times[True]), "verified": verified / len(times[True])}))
    elif dist.get_rank() == 0:
        off_median = statistics.median(times[False])
        print(json.dumps({"on_mean_s": statistics.fmean(times[True]), "off_mean_s": statistics.fmean(times[False]),
                          "on_steps": len(times[True]), "verified": verified / len(times[True]), "poll_s": watchdog_poll_s(distdoctor.guard()),
                          "startup_s": sum(startup) - len(startup) * off_median, "startup_steps": len(startup),
                          "floor": statistics.fmean(floor[True]) / statistics.fmean(floor[False])}))
    dist.destroy_process_group()


def watchdog_poll_s(g) -> float:
    """The watchdog's work per poll, timed here: torch's recorder status every poll, and the store's
    news request (the same read, without changing what the watchdog has seen) at its share of polls:
    one every busy interval (cadence.busy_interval_s)."""
    from distdoctor.embedded.guard import cadence

    watch, rounds = g.watch, 200
    start = time.perf_counter()
    for _ in range(rounds):
        g.flight.status()
    status_s = (time.perf_counter() - start) / rounds
    side = watch.side
    if side is None:
        return status_s
    start = time.perf_counter()
    for _ in range(rounds):
        side.count(side.key("news"), 0)
    news_s = (time.perf_counter() - start) / rounds
    return status_s + news_s * min(1.0, watch.poll_s / cadence.busy_interval_s(watch.world))


def child_hang(mark_file: str) -> None:
    """The DDP loop, unmodified but for rank 1 sleeping before step 3 (started by `distdoctor guard --`)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)))
    loss_fn, optimizer = nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.001)
    for step in range(6):
        if dist.get_rank() == 1 and step == 3:
            Path(mark_file).write_text(str(time.time()))
            time.sleep(60)
        optimizer.zero_grad()
        loss_fn(model(torch.randn(20, 10)), torch.randn(20, 5)).backward()
        optimizer.step()


# -- the parent ------------------------------------------------------------------------------------


def train_launch(mode: str, steps: int, batch: int = 20) -> dict | None:
    env = clean_env(OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    run = timed(torchrun(__file__, "--child-train", mode, str(steps), str(batch)), env=env, bound=900)
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    sys.stderr.write(f"bench_guard: a {mode} launch failed (code {run.code}): {run.stderr[-1500:]}\n")
    return None


def step_figures(repeats: int, steps: int, batch: int = 20) -> list[Figure]:
    out = []
    for mode, label, target in (("default", "guard() defaults", STEP_TARGET), ("all", 'guard(verify="all")', "")):
        launches = [r for r in (train_launch(mode, steps, batch) for _ in range(repeats)) if r]
        on = [r["on_mean_s"] for r in launches]
        off = [r["off_mean_s"] for r in launches]
        ratios = [r["on_mean_s"] / r["off_mean_s"] for r in launches]
        polls = [r["poll_s"] for r in launches if r.get("poll_s")]
        poll = (f"; watchdog poll {statistics.median(polls) * 1e6:.0f} us, 4 a second = "
                f"{statistics.median(polls) * 4 * 100:.3f} % of one core" if polls else "")
        floors = [r["floor"] for r in launches]
        floor = (f"; the method's floor, unguarded blocks against unguarded blocks in the same launches: "
                 f"{statistics.median(floors):.3f}x ({', '.join(f'{r:.3f}' for r in floors)})" if floors else "")
        sampled = ""
        if mode == "default" and launches:
            whole = train_launch("whole", steps, batch)
            sampled = (f"; verified {statistics.median(r['verified'] for r in launches) * 100:.2f} % of the guarded calls"
                       f" (a launch guarding every step at the default budget: "
                       f"{whole['verified'] * 100:.2f} %)" if whole else "")
        startups = [r["startup_s"] for r in launches]
        startup = (f"; start-up, once per run: the first {launches[0]['startup_steps']} guarded steps "
                   f"(the first {VERIFY_FIRST} calls verified) took {statistics.median(startups) * 1e3:.1f} ms more "
                   f"than as many unguarded ones" if startups else "")
        out.append(Figure(f"step time, {label}",
                          f"DDP tutorial loop (batch {batch}), 2 ranks gloo CPU, {steps} steps in blocks of {BLOCK} alternating "
                          f"with and without {label}: mean step with it", statistics.median(on) if on else None,
                          [round(v, 6) for v in on], "mean step without it (same launches)",
                          statistics.median(off) if off else None, [round(v, 6) for v in off],
                          statistics.median(ratios) if ratios else None, "", target,
                          f"ratio: median over {len(launches)} launches of each launch's on/off ratio "
                          f"({', '.join(f'{r:.3f}' for r in ratios)}){floor}{sampled}{poll}{startup}"))
    return out


def hang_figure(repeats: int) -> Figure:
    to_report, to_exit = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            mark = Path(tmp) / "entered"
            env = clean_env(OMP_NUM_THREADS="1", PYTHONPATH=REPO)
            # --on-hang exit: the sleeping rank is a live straggler, which the default policy (auto)
            # reports and watches; this figure is the time to the verdict and to the job's end.
            run = timed([PYTHON, "-m", "distdoctor", "guard", "--hang-timeout", str(HANG_TIMEOUT_S), "--on-hang", "exit",
                         "--report-dir", tmp, "--", *torchrun(__file__, "--child-hang", str(mark))], env=env, bound=120)
            ended = time.time()
            reports = list(Path(tmp).glob("distdoctor-guard-hang-*.json"))
            if not mark.exists() or not reports:
                sys.stderr.write(f"bench_guard: the hang run did not report (code {run.code}): {run.stderr[-1500:]}\n")
                continue
            entered = float(mark.read_text())
            report = json.loads(reports[0].read_text())
            if report["findings"][0]["cause"] != "straggler_rank":
                sys.stderr.write(f"bench_guard: the hang was named {report['findings'][0]['id']}, not straggler_rank\n")
                continue
            to_report.append(reports[0].stat().st_mtime - entered)
            to_exit.append(ended - entered)
    value = statistics.median(to_report) if to_report else None
    return Figure("hang to named cause", f"DDP loop, rank 1 asleep before step 3, hang_timeout={HANG_TIMEOUT_S:g} s: "
                  "rank 1 starts sleeping -> the guard's JSON report names straggler rank 1", value,
                  [round(v, 3) for v in to_report], "rank 1 starts sleeping -> the launcher exited",
                  statistics.median(to_exit) if to_exit else None, [round(v, 3) for v in to_exit], None,
                  f"hang_timeout + {value - HANG_TIMEOUT_S:.2f} s" if value is not None else "",
                  f"<= {HANG_TIMEOUT_S + 2:g} s", "seconds, not a ratio; torch alone waits 30 min (gloo's default timeout)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--batch", type=int, default=20, help="rows a batch (the tutorial's 20); larger: a longer step")
    parser.add_argument("--child-train", nargs=3, metavar=("MODE", "STEPS", "BATCH"), help=argparse.SUPPRESS)
    parser.add_argument("--child-hang", metavar="MARK", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_train:
        child_train(args.child_train[0], int(args.child_train[1]), int(args.child_train[2]))
        return
    if args.child_hang:
        child_hang(args.child_hang)
        return
    repeats, steps = (1, 100) if args.quick else (args.repeats, args.steps)
    figs = step_figures(repeats, steps, args.batch) + [hang_figure(repeats if not args.quick else 1)]
    if args.json:
        print(json.dumps([f.to_dict() for f in figs]))
        return
    print(f"runtime guard, 2 ranks (gloo, loopback), {repeats} launch(es) per mode, {steps} steps each "
          f"(half with the guard), "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    for f in figs[:2]:
        ratio = f"{f.ratio:.3f}x" if f.ratio else "n/a"
        print(f"{f.name:<32} {(f.median_s or 0) * 1e3:8.3f} ms/step vs {(f.baseline_median_s or 0) * 1e3:8.3f} ms/step "
              f"= {ratio}  (target {f.target or '-'}); {f.note}")
    hang = figs[2]
    print(f"{hang.name:<32} {hang.median_s if hang.median_s is not None else float('nan'):6.2f} s to the report, "
          f"{hang.baseline_median_s if hang.baseline_median_s is not None else float('nan'):6.2f} s to the launcher's exit "
          f"(target {hang.target}); runs: {hang.runs_s} / {hang.baseline_runs_s}")


if __name__ == "__main__":
    main()
