"""`distdoctor bench`: the full default sweep on a 2-rank CPU world (target <= 30 s), against the
bare torchrun script (bare_allreduce.py: the cost of starting any 2-rank world), and the link
matrix of an 8-rank loopback world (target <= 10 s), read from the report's own phase time.

Every run counts only when its JSON report shows what the figure claims: every op at every
default size measured and correct, or every one of the 28 rank pairs measured.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from timing import (PYTHON, Figure, Timed, clean_env, describe_failure, distdoctor, interleaved, median,  # noqa: E402
                    print_figures, standard_arguments, timed)

SWEEP_TARGET, LINKS_TARGET = "<= 30 s", "<= 10 s"
BARE = str(Path(__file__).with_name("bare_allreduce.py"))
OPS = 5


def report_of(run: Timed, what: str) -> tuple[dict | None, str | None]:
    if run.code not in (0, 1):
        return None, describe_failure(run, what)
    try:
        return json.loads(run.stdout[run.stdout.find("{"):]), None
    except ValueError:
        return None, f"{what} printed no JSON report"


def sweep_problem(run: Timed, sizes: int) -> str | None:
    report, problem = report_of(run, "distdoctor bench --nproc 2")
    if problem:
        return problem
    rows = report["data"]["bench"]["sweep"]
    if len(rows) != OPS * sizes or not all(r["correct"] for r in rows):
        return f"the sweep measured {len(rows)} of {OPS * sizes} figures (or a wrong result)"
    return None


def link_phase(run: Timed, nproc: int) -> tuple[float | None, str | None]:
    report, problem = report_of(run, f"distdoctor bench --nproc {nproc}")
    if problem:
        return None, problem
    pairs = report["data"]["bench"]["links"]["pairs"]
    if len(pairs) != nproc * (nproc - 1) // 2:
        return None, f"the link matrix measured {len(pairs)} of {nproc * (nproc - 1) // 2} pairs"
    (phase,) = [c for c in report["checks"] if c["name"] == "bench.link_matrix"]
    return phase["duration_s"], None


def sweep_figure(repeats: int, quick: bool, env: dict, cwd: str) -> Figure:
    sizes = ["--sizes", "8:4K:8"] if quick else []
    count = 4 if quick else 12  # 8 B, 32 B ... 32 MiB by 4 (the CPU default)
    subject = distdoctor("bench", "--nproc", "2", "--no-links", "--format", "json", "--timeout", "110", *sizes)
    baseline = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", BARE]
    subjects, baselines = interleaved(lambda: timed(subject, env, bound=120, cwd=cwd),
                                      lambda: timed(baseline, env, bound=120, cwd=cwd), repeats, warmup=not quick)
    problems = [p for p in (sweep_problem(r, count) for r in subjects) if p]
    name = "default sweep, 2 ranks (CPU)" if not quick else "small sweep, 2 ranks (CPU)"
    if problems:
        return Figure.unavailable(name, problems[0], SWEEP_TARGET)
    what = f"distdoctor bench --nproc 2 --no-links ({OPS} ops x {count} sizes, 8 B-{'4 KiB' if quick else '32 MiB'})"
    return Figure.from_runs(name, what, subjects,
                            "torchrun --standalone --nproc-per-node 2 bare_allreduce.py", baselines, SWEEP_TARGET,
                            "wall time of the whole command; every figure measured and correct")


def links_figure(repeats: int, quick: bool, env: dict, cwd: str) -> Figure:
    nproc = 3 if quick else 8
    subject = distdoctor("bench", "--nproc", str(nproc), "--ops", "broadcast", "--sizes", "8", "--iters", "1",
                         "--warmup", "1", "--format", "json", "--timeout", "110")
    phases, problems, runs = [], [], []
    for _ in range(repeats):
        run = timed(subject, env, bound=120, cwd=cwd)
        phase, problem = link_phase(run, nproc)
        runs.append(run)
        (problems.append(problem) if problem else phases.append(phase))
    name = f"link matrix, {nproc} ranks (loopback)"
    if problems:
        return Figure.unavailable(name, problems[0], LINKS_TARGET)
    return Figure(name, f"the link matrix phase of distdoctor bench --nproc {nproc} ({nproc * (nproc - 1) // 2} pairs)",
                  median(phases), [round(p, 3) for p in phases], target=LINKS_TARGET,
                  note=f"phase time from the report; whole command median {median([r.elapsed for r in runs]):.2f} s")


def measure(repeats: int = 3, quick: bool = False) -> list[Figure]:
    env = clean_env(OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="distdoctor-bench-") as cwd:
        return [sweep_figure(repeats, quick, env, cwd), links_figure(repeats, quick, env, cwd)]


def main(argv: list[str] | None = None) -> int:
    args = standard_arguments(__doc__).parse_args(argv)
    print_figures(measure(1 if args.quick else args.repeats, args.quick), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
