"""The guard on a long job: pauses around the hang timeout and real faults, each judged against what happened.

    python benchmarks/soak.py                 # a 20-minute guarded 4-rank DDP job, then 5 fault runs
    python benchmarks/soak.py --quick         # a 30 s job with two pauses, and one fault run (CI's smoke test)
    python benchmarks/soak.py --seed 7 --duration 600 --hang-timeout 5

The job (soak_job.py) runs under `distdoctor guard --hang-timeout H -- torchrun --nproc-per-node 4`
with the default policy. Its schedule is random but seeded (the seed and every event are printed):
one rank at a time sleeps (a slow batch), evaluates (busy CPU) or writes checkpoints, for 1.6-3x
the hang timeout (a long pause) or 0.25-0.6x (a short one), with 10-25 s of training in between.
Judged from stalls.json and the job's output: every long pause is exactly one stall, of its rank, at
its line, as long as the pause; a short pause is none; the job is never ended (exit 0). Meanwhile
every rank's RSS is read from /proc every 10 s (growth after the first quarter of the run), and at
the end each rank reports its guard watchdog's CPU seconds (CPU per hour = CPU / wall x 3600).
Then, in separate runs, real faults, each of which must be named: a raise (job.E001), SIGKILL
(job.E005 or E004), SIGSTOP for 2.5 hang timeouts then SIGCONT (one stall, job.E004, watched and
cleared: exit 0), a receive cycle (job.E006), a shape mismatch (guard.E001, with --verify all).
Exit code 1 when any of it does not hold (each problem is printed).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from timing import PYTHON, REPO, Figure, clean_env, median, print_figures, standard_arguments  # noqa: E402

JOB = Path(__file__).with_name("soak_job.py")
WORLD = 4
KINDS = ("sleep", "evaluate", "checkpoint")
LONG, SHORT = (1.6, 3.0), (0.25, 0.6)   # a pause's length, in hang timeouts
GAP_S = (10.0, 25.0)                     # training between two pauses
WARMUP_S, TAIL_S = 10.0, 15.0            # no pause in the first and the last seconds
FAULTS = ("raise", "kill", "stop", "recvcycle", "mismatch")
EXPECTED = {"raise": ("job.E001",), "kill": ("job.E005", "job.E004"), "stop": ("job.E004",),
            "recvcycle": ("job.E006",), "mismatch": ("guard.E001",)}


def line_of(tag: str) -> int:
    for number, text in enumerate(JOB.read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# LINE:{tag}"):
            return number
    raise KeyError(tag)


def schedule(seed: int, duration_s: float, hang_s: float) -> list[dict[str, Any]]:
    """The pauses: alternately drawn long or short, on a random rank, of a random kind."""
    rng = random.Random(seed)
    events, at = [], WARMUP_S
    while True:
        long = rng.random() < 0.5
        seconds = round(hang_s * rng.uniform(*(LONG if long else SHORT)), 1)
        if at + seconds + TAIL_S > duration_s:
            return events
        events.append({"at": round(at, 1), "rank": rng.randrange(WORLD), "kind": rng.choice(KINDS),
                       "seconds": seconds, "long": long})
        at += seconds + rng.uniform(*GAP_S)


@dataclass
class Outcome:
    """One guarded run: exit code, wall time, output, report directory, the ranks' stats and RSS."""

    code: int | None
    wall_s: float
    output: str
    out: Path
    signalled_at: float | None = None    # seconds after the job's start the driver signalled a rank
    rss: dict[int, list[tuple[float, int]]] = field(default_factory=dict)   # rank -> (s, kB)

    @property
    def reports(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.out / "reports").glob("distdoctor-guard-*.json"))]

    @property
    def stalls(self) -> list[dict[str, Any]]:
        path = self.out / "reports" / "stalls.json"
        return [s for s in json.loads(path.read_text()) if "episode" in s] if path.exists() else []

    def stats(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(self.out.glob("stats*.json"))]


def pids(out: Path) -> dict[int, int]:
    found = {}
    for path in out.glob("pid*"):
        text = path.read_text().strip()
        if text.isdigit():
            found[int(path.name[3:])] = int(text)
    return found


def rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return None


def run(mode: str, duration_s: float, events: list[dict[str, Any]], hang_s: float, root: Path,
        options: tuple[str, ...] = (), bound_s: float | None = None) -> Outcome:
    """One guarded run; the driver reads every rank's RSS every 10 s, and for kill / stop signals the
    first event's rank at its time."""
    out = root / mode
    (out / "reports").mkdir(parents=True)
    (out / "schedule.json").write_text(json.dumps(events))
    cmd = [PYTHON, "-m", "distdoctor", "guard", "--hang-timeout", f"{hang_s:g}", "--report-dir", str(out / "reports"),
           *options, "--", PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
           str(JOB), mode, f"{duration_s:g}", str(out / "schedule.json"), str(out)]
    env = clean_env(OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    log = open(out / "output.txt", "w")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=out, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    outcome = Outcome(None, 0.0, "", out)
    stop = threading.Event()
    threading.Thread(target=_watch, args=(proc, out, mode, events, hang_s, outcome, stop), daemon=True).start()
    try:
        outcome.code = proc.wait(timeout=bound_s or duration_s + 300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        stop.set()
        log.close()
        for pid in pids(out).values():  # a worker the launcher left behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    outcome.wall_s, outcome.output = time.monotonic() - started, (out / "output.txt").read_text(errors="replace")
    (out / "rss.json").write_text(json.dumps({str(r): samples for r, samples in outcome.rss.items()}))
    return outcome


def _watch(proc: subprocess.Popen, out: Path, mode: str, events: list[dict[str, Any]], hang_s: float,
           outcome: Outcome, stop: threading.Event) -> None:
    """RSS every 10 s from the moment every rank wrote its pid; the outside faults at their time."""
    while len(pids(out)) < WORLD and proc.poll() is None and not stop.wait(0.2):
        pass
    ranks, began = pids(out), time.monotonic()
    target = events[0] if events and mode in ("kill", "stop") else None
    next_read = 0.0
    while proc.poll() is None and not stop.is_set():
        now = time.monotonic() - began
        if target is not None and now >= target["at"]:
            pid, target = ranks[events[0]["rank"]], None
            outcome.signalled_at = now
            if mode == "kill":
                os.kill(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGSTOP)
                stop.wait(2.5 * hang_s)
                os.kill(pid, signal.SIGCONT)
        if now >= next_read:
            for rank, pid in ranks.items():
                kb = rss_kb(pid)
                if kb is not None:
                    outcome.rss.setdefault(rank, []).append((round(now, 1), kb))
            next_read = now + 10.0
        stop.wait(0.2)


# -- judging -----------------------------------------------------------------------------------

def judge_pauses(outcome: Outcome, events: list[dict[str, Any]], hang_s: float) -> list[str]:
    """Every long pause exactly one stall of its rank at its line, as long as it; short pauses none."""
    problems = []
    if outcome.code != 0 or "the guard ends the job" in outcome.output:
        problems.append(f"the job was ended (exit {outcome.code}): {_tail(outcome.output)}")
    stalls = sorted(outcome.stalls, key=lambda s: s.get("started_at") or 0)
    long = [e for e in events if e["long"]]
    if len(stalls) != len(long):
        problems.append(f"{len(stalls)} stalls for {len(long)} long pauses: "
                        f"{[(s.get('late_rank'), s.get('where'), s.get('seconds')) for s in stalls]}")
    for event, stall in zip(long, stalls):
        where = f"soak_job.py:{line_of(event['kind'])}"
        seconds = stall.get("seconds")
        if stall.get("late_rank") != event["rank"] or not str(stall.get("where")).endswith(where) \
                or stall.get("verdict") != "job.E002" or seconds is None \
                or not event["seconds"] - 1.5 <= seconds <= event["seconds"] + 3.0:
            problems.append(f"pause {event} got stall {stall.get('episode')}: rank {stall.get('late_rank')} at "
                            f"{stall.get('where')}, {stall.get('verdict')}, {seconds} s")
    return problems


def first_findings(outcome: Outcome) -> list[dict[str, Any]]:
    return [r["findings"][0] for r in outcome.reports if r.get("findings")]


def judge_fault(mode: str, outcome: Outcome, event: dict[str, Any]) -> tuple[list[str], str]:
    """(problems, what was named) for one fault run."""
    rank = event["rank"]
    named = [(f["id"], f["ranks"]) for f in first_findings(outcome)]
    if mode == "stop":
        # The first verdict, while it is stopped: it does not answer (job.E004); a look after SIGCONT
        # finds it outside the collective (job.E002): both name it.
        first = re.search(r"\[stall 1\]:\n\w+ \(1\)\n  (job\.E\d+) \[\w+\] Rank (\d+) ", outcome.output)
        stalls = outcome.stalls
        said = [(s.get("verdict"), s.get("late_rank"), s.get("seconds")) for s in stalls]
        ok = first is not None and (first.group(1), int(first.group(2))) == ("job.E004", rank) and outcome.code == 0 and len(stalls) == 1 and stalls[0].get("verdict") in EXPECTED[mode] + ("job.E002",) \
            and stalls[0].get("late_rank") == rank and stalls[0].get("seconds") is not None \
            and "the guard ends the job" not in outcome.output
        return ([] if ok else [f"stop: exit {outcome.code}, stalls {said}: {_tail(outcome.output)}"]), \
            f"one stall {said[0][0] if said else None} of rank {rank}, watched and cleared, exit {outcome.code}"
    wanted = {rank, rank + 1} if mode == "recvcycle" else {rank}
    hits = [(i, r) for i, r in named if i in EXPECTED[mode] and wanted <= set(r)]
    problems = [] if outcome.code not in (0, None) and hits and all(i in EXPECTED[mode] for i, _ in named) else \
        [f"{mode}: exit {outcome.code}, reports named {named}, expected {EXPECTED[mode]} for ranks {sorted(wanted)}: "
         f"{_tail(outcome.output)}"]
    if not hits:
        return problems, f"nothing right: {named}"
    extra = sorted(set(hits[0][1]) - wanted)
    also = "" if not extra or mode == "recvcycle" else \
        f" (also named: rank{'s' if len(extra) > 1 else ''} {', '.join(map(str, extra))}, ended by the launcher after it)"
    return problems, f"{hits[0][0]} ranks {hits[0][1]}, exit {outcome.code}{also}"


def _tail(text: str) -> str:
    lines = [line for line in text.splitlines() if "distdoctor guard" in line or "Error" in line]
    return " | ".join(lines[-4:])[:600]


# -- figures ---------------------------------------------------------------------------------------

def pause_figures(outcome: Outcome, events: list[dict[str, Any]], seed: int, hang_s: float,
                  problems: list[str]) -> list[Figure]:
    long = [e for e in events if e["long"]]
    stalls = sorted(outcome.stalls, key=lambda s: s.get("started_at") or 0)
    lengths = [s["seconds"] for s in stalls if s.get("seconds") is not None]
    verdict = "as scheduled" if not problems else f"{len(problems)} problem(s)"
    figures = [Figure("pauses: stall length", f"{len(long)} long pauses ({LONG[0]}-{LONG[1]}x hang timeout {hang_s:g} s) "
                      f"and {len(events) - len(long)} short ones ({SHORT[0]}-{SHORT[1]}x) on 4 guarded DDP ranks, "
                      f"{outcome.wall_s / 60:.1f} min, seed {seed}",
                      median(lengths) if lengths else None, [round(x, 2) for x in lengths],
                      "the long pauses' lengths", median([e["seconds"] for e in long]) if long else None,
                      [e["seconds"] for e in long], note=f"{len(stalls)} stalls, each its rank at its line: {verdict}; "
                                                          f"exit {outcome.code}")]
    if figures[0].median_s and figures[0].baseline_median_s:
        figures[0].ratio = figures[0].median_s / figures[0].baseline_median_s
    stats = outcome.stats()
    cpu = [s["guard_cpu_s"] for s in stats if s.get("guard_cpu_s") is not None]
    wall = median([s["wall_s"] for s in stats]) if stats else None
    if cpu and wall:
        per_hour = [c / s["wall_s"] * 3600 for c, s in zip(cpu, stats)]
        figures.append(Figure("guard CPU", "the guard watchdog thread's CPU per rank over the run (median of 4 ranks)",
                              median(cpu), [round(c, 2) for c in cpu], "the run's wall time per rank", wall,
                              ratio=median(cpu) / wall, note=f"{median(per_hour):.1f} CPU-seconds per hour per rank "
                                                             f"({min(per_hour):.1f}-{max(per_hour):.1f})"))
    growth = _rss_growth(outcome.rss)
    if growth:
        values = sorted(growth.values())
        figures.append(Figure("guarded rank RSS", "RSS growth per rank from the first quarter of the run to its end "
                              "(read from /proc every 10 s)", outcome.wall_s, [], ratio_text=f"{median(values):+.1f} MB",
                              note="per rank: " + ", ".join(f"{r}: {growth[r]:+.1f} MB" for r in sorted(growth))
                              + (f"; {_per_hour(median(values), outcome.wall_s):+.1f} MB per hour"
                                 if outcome.wall_s >= 600 else "; too short a run for a rate per hour")))
    return figures


def _rss_growth(rss: dict[int, list[tuple[float, int]]]) -> dict[int, float]:
    out = {}
    for rank, samples in rss.items():
        if len(samples) < 2:
            continue
        start = samples[-1][0] / 4
        first = next((kb for at, kb in samples if at >= start), samples[0][1])
        out[rank] = (samples[-1][1] - first) / 1024
    return out


def _per_hour(megabytes: float, wall_s: float) -> float:
    return megabytes / wall_s * 3600 * 4 / 3 if wall_s else 0.0  # measured over the last three quarters


def main() -> int:
    parser = standard_arguments(__doc__)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds of the pauses run (default 1230; --quick 30; 0: the faults only)")
    parser.add_argument("--hang-timeout", type=float, default=None, help="default 5 s (--quick 3 s)")
    parser.add_argument("--faults", default=None, help=f"comma-separated of {','.join(FAULTS)} (--quick: raise)")
    parser.add_argument("--keep", default=None, help="a directory to keep every run's output and reports in")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    hang_s = args.hang_timeout or (3.0 if args.quick else 5.0)
    duration_s = args.duration if args.duration is not None else (30.0 if args.quick else 1230.0)
    faults = (args.faults or ("raise" if args.quick else ",".join(FAULTS))).split(",")
    if args.quick and args.seed is None and args.duration is None:
        # Two pauses in 30 s: one long, one short, whatever the seed.
        events = [{"at": 5.0, "rank": 1, "kind": "sleep", "seconds": round(2.0 * hang_s, 1), "long": True},
                  {"at": 18.0, "rank": 2, "kind": "evaluate", "seconds": round(0.4 * hang_s, 1), "long": False}]
    else:
        events = schedule(seed, duration_s, hang_s)
    say = sys.stderr if args.json else sys.stdout
    print(f"soak: seed {seed}, hang timeout {hang_s:g} s, {duration_s:g} s, {len(events)} pauses:", file=say)
    for event in events:
        print(f"  at {event['at']:6.1f} s rank {event['rank']} {event['kind']:<10} {event['seconds']:5.1f} s "
              f"({'long' if event['long'] else 'short'})", file=say)
    load = os.getloadavg()
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="distdoctor-soak-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        figures = []
        if duration_s > 0:
            outcome = run("pauses", duration_s, events, hang_s, root)
            found = judge_pauses(outcome, events, hang_s)
            problems += found
            figures = pause_figures(outcome, events, seed, hang_s, found)
        rng = random.Random(seed)
        for mode in faults:
            at = 5.0 if args.quick else rng.uniform(12.0, 20.0)
            event = {"at": round(at, 1), "rank": rng.randrange(WORLD - 1 if mode == "recvcycle" else WORLD),
                     "kind": mode, "seconds": 0.0, "long": False}
            fault = run(mode, at + (10.0 if args.quick else 25.0), [event], hang_s, root,
                        ("--verify", "all") if mode == "mismatch" else (), bound_s=at + 240.0)
            found, named = judge_fault(mode, fault, event)
            problems += found
            figures.append(Figure(f"fault: {mode}", f"rank {event['rank']} at {event['at']:g} s; named: {named}",
                                  round(fault.wall_s, 2), [round(fault.wall_s, 2)],
                                  note="as expected" if not found else "PROBLEM: " + found[0][:300]))
    load_after = os.getloadavg()
    for figure in figures:
        figure.note += f" (load average {load[0]:.1f} before, {load_after[0]:.1f} after; 1-minute)" \
            if figure is figures[0] else ""
    print_figures(figures, args.json)
    for problem in problems:
        print(f"soak: PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
