"""`distdoctor stacks` on a hung and on a busy 8-rank torchrun job, next to `py-spy dump` run by hand on each rank.

    python benchmarks/bench_stacks.py                 # 8 ranks, 5 runs of each, both jobs
    python benchmarks/bench_stacks.py --ranks 4 --quick --json
    python benchmarks/bench_stacks.py --ranks 64 --modes sleep   # the 64-rank hung job (target 3 s)

For each mode of `tests/stacks/jobs/train.py` — `sleep` (DDP on gloo: rank 1 sleeps, the others
wait in the gradient all-reduce) and `busy` (every rank computes, ~0.3 s a step on an idle core;
8 ranks on 2 cores take longer) — starts `python -m torch.distributed.run --nproc-per-node N
train.py MODE`, waits until every rank is at its point, then alternates (ABBA, one warm-up each)
the subject — `distdoctor stacks --format json LAUNCHER_PID`, a whole command from start to report,
every run checked (hung: rank 1 named as job.E002; busy: no error or warning, job.I001) — and the
baseline — `py-spy dump --pid P` on each rank one after another, what one does by hand. Each
figure's note says how many times the ranks were read (the most reads of a rank, median over the
runs). Targets: at most 3 s for the hung job, 6 s for the busy one, at 8 ranks and at 64 (a 64-rank
job takes about two minutes to start on a 2-core machine and ~15 GiB; run it under the heavy lock). The jobs are ended by their
PIDs afterwards, whatever happens. Figures are printed, not asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from timing import PYTHON, Figure, Timed, clean_env, describe_failure, distdoctor, interleaved, print_figures, standard_arguments, timed  # noqa: E402

TRAIN = HERE.parent / "tests" / "stacks" / "jobs" / "train.py"
TARGETS = {"sleep": "<= 3 s (hung)", "busy": "<= 6 s (busy)"}
READY_S = 300.0


def start_job(ranks: int, folder: Path, mode: str) -> tuple[subprocess.Popen, dict[int, int]]:
    ready = folder / "ready"
    ready.mkdir()
    env = clean_env(PYTHONPATH=str(HERE.parent), OMP_NUM_THREADS="1")
    with open(folder / "job.log", "wb") as log:
        job = subprocess.Popen([PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), str(TRAIN),
                                mode, str(ready)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env=env, cwd=str(folder))
    deadline = time.monotonic() + READY_S
    while True:
        pids = {int(p.name[4:]): int(p.read_text()) for p in ready.glob("rank*") if p.read_text()}
        if len(pids) == ranks:
            return job, pids
        if job.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the job did not reach its hang point: {(folder / 'job.log').read_text()[-2000:]}")
        time.sleep(0.2)


def end_job(job: subprocess.Popen, pids: dict[int, int], ready: str) -> None:
    import psutil

    for pid in pids.values():
        try:
            if ready in psutil.Process(pid).cmdline():  # still the worker we started
                os.kill(pid, signal.SIGKILL)
        except (psutil.Error, ProcessLookupError):
            pass
    if job.poll() is None:
        job.kill()
    job.wait(30)


def by_hand(pids: dict[int, int]) -> Timed:
    # The py-spy binary distdoctor runs (pyenv's shim on PATH would add ~0.3 s to every dump).
    from distdoctor.stacks.pyspy import find_pyspy

    program = find_pyspy() or "py-spy"
    start = time.perf_counter()
    outs, code = [], 0
    for pid in pids.values():
        run = subprocess.run([program, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
        outs.append(run.stdout)
        code = code or run.returncode
    return Timed(time.perf_counter() - start, code, "\n".join(outs), "")


def _report(run: Timed) -> dict | None:
    try:
        return json.loads(run.stdout)
    except ValueError:
        return None


def right(mode: str, run: Timed) -> bool:
    """Hung: rank 1 named as the late rank; busy: no error or warning, and "running"."""
    report = _report(run)
    if report is None:
        return False
    if mode == "sleep":
        return any(f["id"] == "job.E002" and f["ranks"] == [1] for f in report["findings"])
    return (not [f for f in report["findings"] if f["severity"] in ("warning", "error", "critical")]
            and any(f["id"] == "job.I001" for f in report["findings"]))


def own_duration(run: Timed) -> float:
    """The report's own duration_s: finding the ranks, reading them, the diagnosis (no start-up)."""
    return float((_report(run) or {}).get("duration_s") or 0.0)


def reads(run: Timed) -> int:
    """How many times the ranks were read: the most reads of one rank."""
    report = _report(run) or {}
    jobs = report.get("data", {}).get("stacks", {}).get("jobs", [])
    return max((n for job in jobs for n in job.get("reads", {}).values()), default=0)


def measure(ranks: int, repeats: int, mode: str) -> list[Figure]:
    folder = Path(tempfile.mkdtemp(prefix=f"distdoctor-bench-stacks-{mode}-"))
    job, pids = None, {}
    target = TARGETS[mode]
    try:
        job, pids = start_job(ranks, folder, mode)
        env = clean_env(PYTHONPATH=str(HERE.parent))
        argv = distdoctor("stacks", "--format", "json", str(job.pid))
        load_start = os.getloadavg()[0]
        subjects, baselines = interleaved(lambda: timed(argv, env=env, bound=60), lambda: by_hand(pids), repeats)
        load_end = os.getloadavg()[0]
        wrong = [r for r in subjects if not right(mode, r)]
        if wrong:
            what = "rank 1 not named" if mode == "sleep" else "an alarm on a busy job, or no job.I001"
            return [Figure.unavailable(f"{ranks} local ranks, {'hung' if mode == 'sleep' else 'busy'}",
                                       describe_failure(wrong[0], "distdoctor stacks") + f" ({what})", target)]
        counts = sorted(reads(r) for r in subjects)
        inside = sorted(own_duration(r) for r in subjects)
        verdict = "every run named rank 1 (job.E002)" if mode == "sleep" else "every run: no error or warning, job.I001"
        note = (f"distdoctor stacks --format json LAUNCHER_PID; {verdict}; reads of a rank: median "
                f"{counts[len(counts) // 2]} (runs {counts[0]}-{counts[-1]}); the report's own duration (find, "
                f"read, diagnose; no start-up): median {inside[len(inside) // 2]:.2f} s; 1-minute load average "
                f"{load_start:.2f} -> {load_end:.2f}")
        return [Figure.from_runs(f"{ranks} local ranks, {'hung' if mode == 'sleep' else 'busy'}",
                                 "distdoctor stacks (find, read each rank until the reads decide, diagnose, report)",
                                 subjects, f"py-spy dump on each of the {ranks} ranks in turn, once", baselines,
                                 target, note)]
    finally:
        if job is not None:
            end_job(job, pids, str(folder / "ready"))
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = standard_arguments(__doc__)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--modes", nargs="*", default=["sleep", "busy"], choices=sorted(TARGETS))
    args = parser.parse_args()
    figures = []
    for mode in args.modes:  # one job at a time: a busy job's ranks would slow the other's reads
        figures += measure(args.ranks, 1 if args.quick else args.repeats, mode)
    print_figures(figures, args.json)


if __name__ == "__main__":
    main()
