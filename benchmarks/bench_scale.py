"""The runtime guard from 16 to 4,096 ranks: real torch ranks on this machine, then simulated ranks on the
guard's real channel and diagnosis.

(a) Real: 16, 32, 48, 64 DDP ranks on gloo under `distdoctor guard --hang-timeout 5 -- torchrun --standalone`,
    rank 37 (or the middle rank) asleep 20 s before its fourth step: whether the first verdict on that stall
    names it alone with its line, and how long after the hang timeout it came (the guard's heading read off
    the launcher's output as it is printed); the healthy twin (no one sleeps), launched after each straggler
    run: whether it finished with exit 0 and the guard ended nothing, and how many stalls it reported.
    `--record FILE` keeps every run (both kinds) as a JSON line.
    Stalls before the sleep are counted apart: 64 ranks importing torch on 2 cores start tens of seconds
    apart, and DDP's first collectives wait for the last (a real stall, reported as one).
(b) Simulated (benchmarks/scale_sim.py): 256, 1,024 and 4,096 ranks, threads in a few processes, each with
    distdoctor's own EpisodeWatch and SideChannel on one real TCPStore, no process groups: the guard's store
    requests per second while the job is healthy (per rank), the time from the stall to the verdict (after
    the hang timeout), the verdict, how many ranks it heard from, and the bytes the asking rank read. Then
    the asking rank's own share alone: every answer already in the store, read and diagnosed (on this
    machine the simulated ranks' answers share its 2 cores; in a real job each rank answers on its own).

Targets (issue 37): real 48 and 64 ranks: the straggler named alone within hang_timeout + 5 s in every run;
simulated 4,096 ranks: a verdict within hang_timeout + 3 s, a healthy load of at most 1 request/s/rank.
Timings on a shared 2-core machine are noisy: the load average is printed with them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from timing import PYTHON, REPO, Figure, clean_env, standard_arguments  # noqa: E402

HANG_TIMEOUT_S, SLEEP_S, STEPS = 5.0, 20.0, 8
REAL_SIZES, QUICK_REAL = (16, 32, 48, 64), (4,)
SIM_SIZES, QUICK_SIM = (256, 1024, 4096), (64,)
HEADING = re.compile(r"distdoctor guard \(rank (\d+)\): a collective has not completed for ([\d.]+) s .*\[stall (\d+)\]")
FINDING = re.compile(r"^\s+(job\.[EW]\d+|guard\.E\d+) \[(\w+)\] (.*)$")


def child(late: int, mark: str, sleep_s: float) -> None:
    """One rank: the DDP tutorial's loop; rank ``late`` writes the time to ``mark`` and sleeps before step 3."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)))
    loss_fn, optimizer = nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.001)
    for step in range(STEPS):
        if rank == late and step == 3:
            Path(mark).write_text(str(time.time()))
            time.sleep(sleep_s)  # the straggler's line
        optimizer.zero_grad()
        loss_fn(model(torch.randn(20, 10)), torch.randn(20, 5)).backward()
        optimizer.step()
    dist.destroy_process_group()


def read_lines(stream: Any, into: list[tuple[float, str]]) -> None:
    for line in iter(stream.readline, ""):
        into.append((time.time(), line.rstrip("\n")))


def real_run(nproc: int, late: int, sleep_s: float, bound_s: float = 900) -> dict[str, Any]:
    """One guarded launch; the stalls it reported, each with its first verdict and when it was printed."""
    with tempfile.TemporaryDirectory() as tmp:
        mark = Path(tmp) / "slept"
        cmd = [PYTHON, "-m", "distdoctor", "guard", "--hang-timeout", str(HANG_TIMEOUT_S), "--report-dir", tmp, "--",
               PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), __file__,
               "--child", str(late), str(mark), str(sleep_s)]
        started = time.time()
        proc = subprocess.Popen(cmd, env=clean_env(OMP_NUM_THREADS="1", PYTHONPATH=REPO), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines: list[tuple[float, str]] = []
        reader = threading.Thread(target=read_lines, args=(proc.stdout, lines), daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=bound_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            code = None
        reader.join(10)
        slept = float(mark.read_text()) if mark.exists() else None
    return {"nproc": nproc, "late": late, "code": code, "wall_s": time.time() - started, "slept_at": slept,
            "stalls": stalls_of(lines), "faults": sum("guard.W012" in line for _, line in lines),
            "said": [f"{at - started:8.2f} {line}" for at, line in lines if line.startswith("distdoctor guard")
                     or FINDING.match(line)]}


def stalls_of(lines: list[tuple[float, str]]) -> list[dict[str, Any]]:
    """Every first verdict the guard printed: when, its first finding's ID, cause and title."""
    out = []
    for i, (at, line) in enumerate(lines):
        heading = HEADING.search(line)
        if not heading:
            continue
        first = next((FINDING.match(text) for _, text in lines[i + 1:i + 8] if FINDING.match(text)), None)
        out.append({"at": at, "owner": int(heading.group(1)), "stall": int(heading.group(3)),
                    "id": first.group(1) if first else None, "title": first.group(3) if first else ""})
    return out


def judge_real(run: dict[str, Any]) -> dict[str, Any]:
    """The sleeper's stall: the first verdict after it fell asleep that names anyone at the sleeper's line
    (a stall of ranks CPU-starved on 2 cores may come first, and is counted apart). Right when it names
    the sleeper alone (job.E002), and no verdict after the sleep named an innocent rank at that line."""
    late, slept = run["late"], run["slept_at"]
    after = [s for s in run["stalls"] if slept is not None and s["at"] >= slept]
    before = [s for s in run["stalls"] if slept is None or s["at"] < slept]
    at_line = [s for s in after if "the straggler's line" in s["title"]]
    first = at_line[0] if at_line else (after[0] if after else None)
    alone = bool(at_line and first["id"] == "job.E002" and first["title"].startswith(f"Rank {late} has not arrived"))
    if not alone:
        sys.stderr.write(f"bench_scale: {run['nproc']} ranks, rank {late} asleep at {slept}: not right; the guard said:\n"
                         + "\n".join(run["said"][-60:]) + "\n")
    return {"right": alone, "verdict_after_s": (first["at"] - slept - HANG_TIMEOUT_S) if first else None,
            "first": first, "stalls_before": len(before), "stalls_after": len(after) - len(at_line[:1])}


ENDED = ("the guard ends the job", "the job ends,")


def judge_twin(run: dict[str, Any]) -> dict[str, Any]:
    """A healthy twin is right when it finished (exit 0) and the guard ended nothing."""
    ended = any(end in line for line in run["said"] for end in ENDED)
    return {"right": run["code"] == 0 and not ended, "ended": ended, "stalls": len(run["stalls"]),
            "first_ids": [s["id"] for s in run["stalls"]]}


def record_run(path: Path | None, run: dict[str, Any], judged: dict[str, Any]) -> None:
    """Every run, straggler and twin alike, as one JSON line (what the guard said, how it was judged)."""
    if path is not None:
        with open(path, "a") as sink:
            sink.write(json.dumps({**{k: v for k, v in run.items() if k != "said"}, "said": run["said"][-80:],
                                   "judged": judged, "load": os.getloadavg()[0], "at": time.strftime("%H:%M:%S")},
                                  default=str) + "\n")


def real_figures(sizes: tuple[int, ...], repeats: int, sleep_s: float, record: Path | None = None) -> list[Figure]:
    figures = []
    for nproc in sizes:
        late = 37 if nproc > 37 else nproc // 2
        runs, twins = [], []
        for _ in range(repeats):  # straggler and twin alternate: the machine's load hits both alike
            run = real_run(nproc, late, sleep_s)
            runs.append(judge_real(run))
            record_run(record, run, runs[-1])
            twin = real_run(nproc, -1, sleep_s)
            twins.append(judge_twin(twin))
            record_run(record, twin, twins[-1])
        # Every run's first verdict on the sleeper's stall is timed; whether it was right is in the note.
        times = [r["verdict_after_s"] for r in runs if r["verdict_after_s"] is not None]
        right = sum(r["right"] for r in runs)
        median = sorted(times)[len(times) // 2] if times else None
        wrong = [(r["first"] or {}).get("title", "no verdict")[:200] for r in runs if not r["right"]]
        note = (f"straggler named alone with its line in {right}/{len(runs)} runs; first verdicts: "
                f"{[(r['first'] or {}).get('id') for r in runs]}{f' (not right: {wrong})' if wrong else ''}; "
                f"other stalls before / after the sleep (ranks slow to start or CPU-starved): "
                f"{[(r['stalls_before'], r['stalls_after']) for r in runs]}; healthy twins finished, nothing ended: "
                f"{sum(t['right'] for t in twins)}/{len(twins)} (stalls reported: {[t['stalls'] for t in twins]}, "
                f"first verdicts {[t['first_ids'] for t in twins]}); load {os.getloadavg()[0]:.1f}")
        figures.append(Figure(f"real {nproc} ranks: verdict after hang timeout", f"{nproc} DDP ranks (gloo), rank {late} "
                              f"asleep {sleep_s:g} s, hang_timeout {HANG_TIMEOUT_S:g} s", median,
                              [round(t, 2) for t in times], target="<= 5 s after the hang timeout, every run (48, 64)",
                              note=note))
    return figures


def sim_figures(sizes: tuple[int, ...], quick: bool) -> list[Figure]:
    import scale_sim

    figures = []
    for world in sizes:
        run = scale_sim.run(world, straggler=world // 3, healthy_s=8.0 if quick else 30.0,
                            warm_s=2.0 if quick else None, processes=4 if world <= 1024 else 8)
        right = run["verdict"] == "job.E002" and run["named"] == [world // 3]
        note = (f"healthy: {run['healthy_rate']:.1f} store requests/s for the job = {run['healthy_rate_per_rank']:.3f}/s "
                f"per rank; verdict {run['verdict']} naming {run['named'][:4]} ({'right' if right else 'WRONG'}), "
                f"heard from {run['heard_from']}/{world}; {(run['look_bytes'] or 0) / 1e6:.2f} MB read by the asking "
                f"rank; during the stall {run['stall_rate_per_rank'] or 0:.2f} requests/s per rank; "
                f"{run['fault_count']} faults{' (' + run['faults'][0][:160] + ')' if run['faults'] else ''}; "
                f"{run['connected']}/{world} ranks connected; load {os.getloadavg()[0]:.1f}")
        figures.append(Figure(f"simulated {world} ranks: verdict after hang timeout", f"{world} simulated ranks on one "
                              f"TCPStore, one straggler, hang_timeout {run['hang_timeout']:g} s",
                              run["after_hang_timeout_s"],
                              [round(run["after_hang_timeout_s"], 2)] if run["after_hang_timeout_s"] is not None else [],
                              target="<= 3 s at 4,096; <= 1 request/s/rank healthy", note=note))
    return figures


def asking_figures(sizes: tuple[int, ...]) -> list[Figure]:
    """The asking rank's own share of a look: every answer already in the store, read and diagnosed."""
    import scale_sim

    figures = []
    for world in sizes:
        cost = scale_sim.asking_rank_cost(world, world // 3)
        figures.append(Figure(f"asking rank alone, {world} answers: read + diagnose", f"{world} answers (2 KB each) in "
                              "one TCPStore -> the verdict", cost["read_s"] + cost["diagnose_s"],
                              [round(cost["read_s"] + cost["diagnose_s"], 3)],
                              note=f"read {cost['read_s']:.2f} s ({cost['requests']} requests, {cost['bytes'] / 1e6:.2f} MB), "
                                   f"diagnosis {cost['diagnose_s']:.2f} s; verdict {cost['verdict']} naming "
                                   f"{cost['named'][:4]}; load {os.getloadavg()[0]:.1f}"))
    return figures


def main() -> int:
    parser = standard_arguments(__doc__)
    parser.set_defaults(repeats=1)
    parser.add_argument("--only", choices=("real", "sim"), default=None)
    parser.add_argument("--sizes", default="", help="comma-separated sizes for the part chosen with --only")
    parser.add_argument("--record", type=Path, default=None, help="append every real run as a JSON line to this file")
    parser.add_argument("--child", nargs=3, metavar=("LATE", "MARK", "SLEEP"), help=argparse_suppress())
    args = parser.parse_args()
    if args.child:
        child(int(args.child[0]), args.child[1], float(args.child[2]))
        return 0
    sizes = tuple(int(s) for s in args.sizes.split(",") if s) if args.sizes else ()
    figures: list[Figure] = []
    if args.only in (None, "real"):
        figures += real_figures(sizes or (QUICK_REAL if args.quick else REAL_SIZES), args.repeats,
                                HANG_TIMEOUT_S + 3 if args.quick else SLEEP_S, args.record)
    if args.only in (None, "sim"):
        figures += sim_figures(sizes or (QUICK_SIM if args.quick else SIM_SIZES), args.quick)
        figures += asking_figures(sizes or (QUICK_SIM if args.quick else SIM_SIZES))
    if args.json:
        print(json.dumps([f.to_dict() for f in figures]))
    else:
        for f in figures:
            value = f"{f.median_s:+.2f} s" if f.median_s is not None else "none"
            print(f"{f.name:<48} {value:>9}  {f.note}")
    return 0


def argparse_suppress() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
