"""Shared helpers for the benchmarks: timed commands, interleaved runs, medians, figures.

A figure is a subject measured against a baseline *in the same run*, alternating the two
(baseline, subject, subject, baseline, ...) so that drift in the machine's load hits both
alike; the ratio of the medians is the number the design's targets are stated in.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from table import print_table

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
DISTRIBUTED_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "GROUP_RANK", "ROLE_RANK", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "NODE_RANK")
SCRUB_PREFIXES = ("DISTDOCTOR_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "JSM_", "PET_",
                  "GLOO_", "NCCL_", "TORCH_NCCL_", "PYTEST_")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment minus anything that describes a distributed job."""
    env = {k: v for k, v in os.environ.items()
           if k not in DISTRIBUTED_VARS and not k.startswith(SCRUB_PREFIXES)}
    env.update(NO_COLOR="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def distdoctor(*args: str) -> list[str]:
    return [PYTHON, "-m", "distdoctor", *args]


@dataclass
class Timed:
    """One run of a command: wall time, exit code (None: killed at the bound), output."""

    elapsed: float
    code: int | None
    stdout: str
    stderr: str

    @property
    def hung(self) -> bool:
        return self.code is None


def timed(argv: Sequence[str], env: dict[str, str] | None = None, bound: float = 300.0,
          cwd: str | None = None) -> Timed:
    """Run ``argv`` to completion or until ``bound`` s (then kill its process group)."""
    start = time.perf_counter()
    proc = subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=bound)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        code = None
    return Timed(time.perf_counter() - start, code, out, err)


def interleaved(subject: Callable[[], Timed], baseline: Callable[[], Timed], repeats: int,
                warmup: bool = True) -> tuple[list[Timed], list[Timed]]:
    """Run baseline and subject ``repeats`` times each, alternating the order every round
    (ABBA) so slow drift in the machine's load is shared; one unrecorded warm-up of each first
    so both read the files from the page cache alike."""
    if warmup:
        baseline()
        subject()
    subjects: list[Timed] = []
    baselines: list[Timed] = []
    for i in range(repeats):
        if i % 2 == 0:
            baselines.append(baseline())
            subjects.append(subject())
        else:
            subjects.append(subject())
            baselines.append(baseline())
    return subjects, baselines


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class Figure:
    """One line of the benchmark table."""

    name: str
    subject: str  # what was measured
    median_s: float | None  # None: could not be measured (see note)
    runs_s: list[float] = field(default_factory=list)
    baseline: str = ""
    baseline_median_s: float | None = None
    baseline_runs_s: list[float] = field(default_factory=list)
    ratio: float | None = None  # subject median / baseline median
    ratio_text: str = ""  # when the ratio is a bound ("< 0.15") rather than a number
    target: str = ""
    note: str = ""

    @classmethod
    def from_runs(cls, name: str, subject: str, runs: Sequence[Timed], baseline: str,
                  baseline_runs: Sequence[Timed], target: str = "", note: str = "") -> "Figure":
        s = median([r.elapsed for r in runs])
        b = median([r.elapsed for r in baseline_runs])
        return cls(name, subject, s, [round(r.elapsed, 3) for r in runs], baseline, b,
                   [round(r.elapsed, 3) for r in baseline_runs], s / b if b else None, "", target, note)

    @classmethod
    def unavailable(cls, name: str, why: str, target: str = "") -> "Figure":
        return cls(name, "", None, target=target, note=f"not available yet: {why}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe_failure(run: Timed, what: str) -> str:
    """A one-line reason a measured command did not do what the figure needs."""
    if run.hung:
        return f"{what} was still running at its bound"
    # The last line that says something (typer's usage errors come inside a drawn box).
    lines = [line.strip(" \t│╭╮╰╯─") for line in (run.stderr + "\n" + run.stdout).splitlines()]
    said = [line for line in lines if any(c.isalpha() for c in line)]
    return f"{what} exited {run.code}: {(said[-1] if said else 'no output')[:200]}"


def print_figures(figures: Sequence["Figure"], as_json: bool) -> None:
    """A benchmark script's output: the figures as JSON (for run.py) or as run.py's table."""
    if as_json:
        import json

        print(json.dumps([f.to_dict() for f in figures], indent=2))
    else:
        print_table(figures)


def standard_arguments(doc: str | None):
    """The options every benchmark script takes: --repeats, --quick, --json."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser
