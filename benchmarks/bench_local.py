"""`distdoctor check --stage local` against `python -c "import torch"`.

The local stage's floor is importing torch (it reads the torch build's backends and versions),
so the figure is how much the diagnosis adds on top of that import. Target: <= 1.05x. The command
reads torch's facts in a child process started before typer is imported, so the child's import
runs on one core while the checks that need no torch run on another; the child ends with
os._exit once it has printed, so neither process pays torch's interpreter teardown.

A second figure compares with `python -c "import torch, os; os._exit(0)"`, the import without
that teardown: how much the diagnosis adds to the import alone.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from timing import PYTHON, Figure, clean_env, describe_failure, distdoctor, interleaved, timed, print_figures, standard_arguments  # noqa: E402

TARGET = "<= 1.05x"
BARE_IMPORT = "import torch, os; os._exit(0)"


def measure(repeats: int = 5, quick: bool = False) -> list[Figure]:
    env = clean_env()
    # A directory without a pyproject.toml: the run uses distdoctor's defaults only.
    with tempfile.TemporaryDirectory(prefix="distdoctor-bench-") as cwd:
        subject_argv = distdoctor("check", "--stage", "local", "--format", "json")
        baseline_argv = [PYTHON, "-c", "import torch"]
        bare_argv = [PYTHON, "-c", BARE_IMPORT]
        bares: list = []

        def baseline_then_bare():
            # The bare import runs in the same rounds, next to the baseline, so drift hits all three.
            bares.append(timed(bare_argv, env, bound=120, cwd=cwd))
            return timed(baseline_argv, env, bound=120, cwd=cwd)

        subjects, baselines = interleaved(lambda: timed(subject_argv, env, bound=120, cwd=cwd),
                                          baseline_then_bare, repeats, warmup=not quick)
    # Exit 0/1 are diagnoses (1: findings at the fail level on this machine); 2/3 are not.
    bad = [r for r in subjects if r.code not in (0, 1)]
    if bad:
        return [Figure.unavailable("local stage", describe_failure(bad[0], "distdoctor check --stage local"), TARGET)]
    checks = json.loads(subjects[-1].stdout).get("checks", [])
    note = f"{len(checks)} local checks ran"
    bares = bares[1:] if len(bares) > len(baselines) else bares  # the warm-up's
    return [Figure.from_runs("local stage", "distdoctor check --stage local", subjects,
                             'python -c "import torch"', baselines, TARGET, note),
            Figure.from_runs("local stage", "distdoctor check --stage local", subjects,
                             f'python -c "{BARE_IMPORT}"', bares, "", "the import without torch's teardown at exit")]


def main(argv: list[str] | None = None) -> int:
    args = standard_arguments(__doc__).parse_args(argv)
    print_figures(measure(1 if args.quick else args.repeats, args.quick), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
