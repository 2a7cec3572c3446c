"""The full 2-rank self-test (`distdoctor check --nproc 2`) against `python -c "import torch"`
(target: <= 1.25x) and against a bare torchrun script that only inits gloo and runs one
all_reduce (bare_allreduce.py; target: <= 1.0x). All three alternate in the same rounds.

The self-test counts only when it really ran the cross-rank stages: its JSON must show both
ranks reported and rendezvous and collective checks passed; otherwise the figure says why.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from timing import PYTHON, Figure, Timed, clean_env, describe_failure, distdoctor, interleaved, timed, print_figures, standard_arguments  # noqa: E402

TARGET = "<= 1.0x"
IMPORT_TARGET = "<= 1.25x"
IMPORT_TORCH = [PYTHON, "-c", "import torch"]
BARE = str(Path(__file__).with_name("bare_allreduce.py"))


def baseline_argv() -> list[str]:
    # --standalone: a c10d rendezvous on a free localhost port, as a one-node torchrun job runs.
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", BARE]


def verify_selftest(run: Timed) -> str | None:
    """None when the run is a real 2-rank self-test that passed, else what is missing."""
    if run.code not in (0, 1):
        return describe_failure(run, "distdoctor check --nproc 2")
    try:
        report = json.loads(run.stdout[run.stdout.find("{"):])
    except (json.JSONDecodeError, ValueError):
        return "distdoctor check --nproc 2 printed no JSON report"
    reported = sorted(report.get("world", {}).get("ranks_reported", []))
    stages = {c.get("stage") for c in report.get("checks", []) if c.get("status") == "pass"}
    if reported != [0, 1] or not {"rendezvous", "collective"} <= stages:
        return (f"distdoctor check --nproc 2 ran no 2-rank world (ranks reported {reported}, "
                f"stages passed {sorted(s for s in stages if s)})")
    return None


def measure(repeats: int = 5, quick: bool = False) -> list[Figure]:
    env = clean_env(OMP_NUM_THREADS="1")
    subject_argv = distdoctor("check", "--nproc", "2", "--format", "json")
    with tempfile.TemporaryDirectory(prefix="distdoctor-bench-") as cwd:
        if not quick:
            # One probe of each first (it is also the warm-up): a self-test that does not run,
            # or a baseline that fails, ends the figure before repeats x both are spent on it.
            problem = verify_selftest(timed(subject_argv, env, bound=120, cwd=cwd))
            if problem:
                return [Figure.unavailable("2-rank self-test", problem, TARGET)]
            bare = timed(baseline_argv(), env, bound=120, cwd=cwd)
            if bare.code != 0:
                return [Figure.unavailable("2-rank self-test", describe_failure(bare, "the bare torchrun script"), TARGET)]
        imports: list[Timed] = []

        def import_then_bare() -> Timed:
            # The import baseline runs in the same rounds, next to the torchrun one: drift hits all three.
            imports.append(timed(IMPORT_TORCH, env, bound=120, cwd=cwd))
            return timed(baseline_argv(), env, bound=120, cwd=cwd)

        subjects, baselines = interleaved(lambda: timed(subject_argv, env, bound=120, cwd=cwd),
                                          import_then_bare, repeats, warmup=False)
    problems = [p for p in map(verify_selftest, subjects) if p]
    if problems:
        return [Figure.unavailable("2-rank self-test", problems[0], TARGET)]
    failed = [b for b in baselines if b.code != 0]
    if failed:
        return [Figure.unavailable("2-rank self-test", describe_failure(failed[0], "the bare torchrun script"), TARGET)]
    verified = "every run verified: ranks 0,1 reported, rendezvous + collective passed"
    return [Figure.from_runs("2-rank self-test", "distdoctor check --nproc 2", subjects,
                             'python -c "import torch"', imports, IMPORT_TARGET, verified),
            Figure.from_runs("2-rank self-test", "distdoctor check --nproc 2", subjects,
                             "torchrun --standalone --nproc-per-node 2 bare_allreduce.py", baselines, TARGET,
                             verified)]


def main(argv: list[str] | None = None) -> int:
    args = standard_arguments(__doc__).parse_args(argv)
    print_figures(measure(1 if args.quick else args.repeats, args.quick), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
