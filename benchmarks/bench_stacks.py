"""`distdoctor stacks` on a hung 8-rank torchrun job, next to `py-spy dump` run by hand on each rank.

    python benchmarks/bench_stacks.py                 # 8 ranks, 5 runs of each
    python benchmarks/bench_stacks.py --ranks 4 --quick --json

Starts `python -m torch.distributed.run --nproc-per-node N tests/stacks/jobs/train.py sleep`
(DDP on gloo: rank 1 sleeps, the others wait in the gradient all-reduce), waits until every rank
is at its hang point, then alternates (ABBA, one warm-up each) the subject — `distdoctor stacks
--format json LAUNCHER_PID`, a whole command from start to report, every run checked to name
rank 1 as job.E002 — and the baseline — `py-spy dump --pid P` on each rank one after another,
what one does by hand. Target: at most 3 s for 8 local ranks. The job is ended by its PIDs
afterwards, whatever happens. Figures are printed, not asserted.
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
TARGET = "<= 3 s for 8 ranks"
READY_S = 300.0


def start_job(ranks: int, folder: Path) -> tuple[subprocess.Popen, dict[int, int]]:
    ready = folder / "ready"
    ready.mkdir()
    env = clean_env(PYTHONPATH=str(HERE.parent), OMP_NUM_THREADS="1")
    with open(folder / "job.log", "wb") as log:
        job = subprocess.Popen([PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), str(TRAIN),
                                "sleep", str(ready)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
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
    start = time.perf_counter()
    outs, code = [], 0
    for pid in pids.values():
        run = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
        outs.append(run.stdout)
        code = code or run.returncode
    return Timed(time.perf_counter() - start, code, "\n".join(outs), "")


def names_rank_1(run: Timed) -> bool:
    try:
        report = json.loads(run.stdout)
    except ValueError:
        return False
    return any(f["id"] == "job.E002" and f["ranks"] == [1] for f in report["findings"])


def measure(ranks: int, repeats: int) -> list[Figure]:
    folder = Path(tempfile.mkdtemp(prefix="distdoctor-bench-stacks-"))
    job, pids = None, {}
    try:
        job, pids = start_job(ranks, folder)
        env = clean_env(PYTHONPATH=str(HERE.parent))
        argv = distdoctor("stacks", "--format", "json", str(job.pid))
        load_start = os.getloadavg()[0]
        subjects, baselines = interleaved(lambda: timed(argv, env=env, bound=60), lambda: by_hand(pids), repeats)
        load_end = os.getloadavg()[0]
        wrong = [r for r in subjects if not names_rank_1(r)]
        if wrong:
            return [Figure.unavailable("stacks", describe_failure(wrong[0], "distdoctor stacks") + " (rank 1 not named)", TARGET)]
        note = (f"distdoctor stacks --format json LAUNCHER_PID; every run named rank 1 (job.E002); "
                f"1-minute load average {load_start:.2f} -> {load_end:.2f}")
        return [Figure.from_runs(f"{ranks} local ranks", "distdoctor stacks (find, read, diagnose, report)", subjects,
                                 f"py-spy dump on each of the {ranks} ranks in turn", baselines, TARGET, note)]
    finally:
        if job is not None:
            end_job(job, pids, str(folder / "ready"))
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = standard_arguments(__doc__)
    parser.add_argument("--ranks", type=int, default=8)
    args = parser.parse_args()
    print_figures(measure(args.ranks, 1 if args.quick else args.repeats), args.json)


if __name__ == "__main__":
    main()
