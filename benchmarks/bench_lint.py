"""Throughput of `distdoctor lint` in lines per second, next to a bare `ast.parse` of the same files.

    python benchmarks/bench_lint.py --corpus /work/corpus          # a corpus of real training code
    python benchmarks/bench_lint.py                                # this repository's own sources
    python benchmarks/bench_lint.py --quick --json

Both run in this process: the subject is distdoctor.lint.lint_paths over the corpus (reading
the files included), the baseline reads and parses every file with ast.parse and does nothing
else (both with the cycle collector paused, as lint_paths does), alternated (ABBA) after one warm-up of each. Target: at least 50,000 lines/s for the
subject. The ratio says what the rules cost on top of parsing. Lines per CPU-second (this
process's CPU time) are printed beside lines per wall-second: on a machine shared with other
work the wall figure measures the neighbours too.
"""

from __future__ import annotations

import ast
import gc
import os
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from timing import Figure, median, print_figures, standard_arguments  # noqa: E402

TARGET = ">= 50,000 lines/s"


def python_files(root: Path) -> list[Path]:
    from distdoctor.lint.files import iter_sources

    return [Path(s.name) for s in iter_sources([str(root)]) if s.text is not None]


def parse_all(files: list[Path]) -> tuple[float, float]:
    # Like lint_paths, with the cycle collector paused: the baseline is parsing at its fastest.
    gc.disable()
    started, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for file in files:
            try:
                ast.parse(file.read_text(encoding="utf-8", errors="replace"), filename=str(file))
            except SyntaxError:
                pass
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    gc.enable()
    return elapsed, cpu


def lint_all(root: Path) -> tuple[float, float, int, int]:
    from distdoctor.lint import lint_paths

    started, cpu = time.perf_counter(), time.process_time()
    report = lint_paths([str(root)])
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    parse = next(c for c in report.checks if c["name"] == "parse")
    return elapsed, cpu, parse["lines"], len(report.findings)


def measure(root: Path, repeats: int) -> Figure:
    files = python_files(root)
    parse_all(files)
    lint_all(root)  # warm-up of both: page cache, imports
    subject: list[float] = []
    baseline: list[float] = []
    subject_cpu: list[float] = []
    baseline_cpu: list[float] = []
    lines = findings = 0
    for i in range(repeats):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for which in order:
            if which == 0:
                wall, cpu = parse_all(files)
                baseline.append(wall)
                baseline_cpu.append(cpu)
            else:
                wall, cpu, lines, findings = lint_all(root)
                subject.append(wall)
                subject_cpu.append(cpu)
    s, b = median(subject), median(baseline)
    sc, bc = median(subject_cpu), median(baseline_cpu)
    return Figure(
        name=f"lint, {lines:,} lines in {len(files)} files",
        subject=f"lint_paths({root.name or root}) -> {findings} findings",
        median_s=s, runs_s=[round(x, 3) for x in subject],
        baseline="ast.parse of the same files", baseline_median_s=b, baseline_runs_s=[round(x, 3) for x in baseline],
        ratio=s / b if b else None, target=TARGET,
        note=(f"{lines / s:,.0f} lines/s wall, {lines / sc:,.0f} lines per CPU-s "
              f"(parse alone {lines / b:,.0f} lines/s wall, {lines / bc:,.0f} per CPU-s)"),
    )


def main() -> int:
    parser = standard_arguments(__doc__)
    parser.add_argument("--corpus", type=Path, default=HERE.parent / "distdoctor",
                        help="directory of Python files to lint (default: this repository's package)")
    args = parser.parse_args()
    if not args.corpus.is_dir():
        print(f"bench_lint: --corpus {args.corpus} is not a directory", file=sys.stderr)
        return 2
    os.environ.setdefault("NO_COLOR", "1")
    figure = measure(args.corpus, 1 if args.quick else args.repeats)
    print_figures([figure], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
