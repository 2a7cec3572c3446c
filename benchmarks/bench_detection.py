"""Time to name a missing rank and an unreachable master, against the deadline, next to how long
plain torch takes to fail in the same situation.

Both situations are made on loopback, with a free port:
- missing rank: WORLD_SIZE=2 and only rank 0 is started;
- unreachable master: rank 1 is started and nothing listens at MASTER_ADDR:MASTER_PORT.
Plain torch is the bare script (init_process_group("gloo") with torch's default timeout, one
all_reduce), watched for at most ``--torch-bound`` seconds; "> bound" means it had not failed.
Torch's own defaults, from its source: init_process_group's timeout defaults to
``default_pg_timeout`` = 30 min for gloo (torch/distributed/constants.py, from
kProcessGroupDefaultTimeout in c10d/ProcessGroup.hpp) and 10 min for NCCL
(kProcessGroupNCCLDefaultTimeout in ProcessGroupNCCL.hpp); the env:// rendezvous hands that
timeout to the TCPStore, so a missing rank or master is reported after 1800 s (gloo).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).parent))

from timing import PYTHON, Figure, Timed, clean_env, describe_failure, distdoctor, free_port, median, timed, print_figures, standard_arguments  # noqa: E402

BARE = str(Path(__file__).with_name("bare_allreduce.py"))
TORCH_DEFAULT_S = 1800  # gloo; see the module docstring for where torch sets it
TORCH_DEFAULT_NOTE = "torch's default: 1800 s (gloo) / 600 s (nccl)"


def world_env(rank: int, port: int) -> dict[str, str]:
    return clean_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")


def report_of(run: Timed) -> dict[str, Any] | None:
    start = run.stdout.find("{")
    try:
        return json.loads(run.stdout[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        return None


def names_missing_rank(run: Timed) -> str | None:
    report = report_of(run)
    if report is None:
        return describe_failure(run, "distdoctor (rank 0 alone)")
    missing = [f for f in report.get("findings", []) if f.get("cause") == "rank_missing" and 1 in f.get("ranks", [])]
    if not missing:
        causes = sorted({f.get("cause") for f in report.get("findings", [])})
        return f"rank 0 alone did not name rank 1 missing (causes: {causes})"
    return None


def names_unreachable_master(run: Timed) -> str | None:
    report = report_of(run)
    if report is None:
        return describe_failure(run, "distdoctor (rank 1, no master)")
    if not any(f.get("cause") == "master_unreachable" for f in report.get("findings", [])):
        causes = sorted({f.get("cause") for f in report.get("findings", [])})
        return f"rank 1 without a master did not name master_unreachable (causes: {causes})"
    return None


def detection_figure(name: str, rank: int, deadline: float, repeats: int, torch_bound: float,
                     verify: Callable[[Timed], str | None], args: tuple[str, ...] = ()) -> Figure:
    target = f"<= deadline + 1 s ({deadline + 1:g} s)"
    runs: list[Timed] = []
    for _ in range(repeats):
        port = free_port()  # nothing listens there: rank 0 of the world is never started, or is alone
        run = timed(distdoctor("check", "--format", "json", "--timeout", f"{deadline:g}", *args),
                    world_env(rank, port), bound=deadline + 30)
        problem = verify(run)
        if problem:
            return Figure.unavailable(name, problem, target)
        runs.append(run)
    torch_run = timed([PYTHON, BARE], world_env(rank, free_port()), bound=torch_bound)
    subject = median([r.elapsed for r in runs])
    if torch_run.hung:
        torch_text = f"> {torch_bound:g} s (still waiting; killed)"
        ratio_text = f"< {subject / torch_bound:.3f}"
        ratio = None
    else:
        torch_text = f"failed after {torch_run.elapsed:.1f} s (exit {torch_run.code})"
        ratio = subject / torch_run.elapsed
        ratio_text = ""
    return Figure(
        name=name, subject=f"distdoctor check --timeout {deadline:g} (rank {rank})", median_s=subject,
        runs_s=[round(r.elapsed, 3) for r in runs],
        baseline=f"plain torch: {torch_text}", baseline_median_s=None if torch_run.hung else torch_run.elapsed,
        baseline_runs_s=[round(torch_run.elapsed, 3)], ratio=ratio, ratio_text=ratio_text, target=target,
        note=f"{subject / deadline:.2f} of the deadline; {TORCH_DEFAULT_NOTE}",
    )


def quick_deadline() -> float:
    """--quick's deadline: 3 s of work after importing torch, which the deadline includes and
    which takes 1-8 s on a loaded machine (timed here, once)."""
    import_s = timed([PYTHON, "-c", "import torch"], clean_env(), bound=300).elapsed
    return round(3.0 + 2.0 * import_s, 1)


def measure(repeats: int = 5, quick: bool = False, deadline: float | None = None,
            torch_bound: float | None = None) -> list[Figure]:
    deadline = deadline or (quick_deadline() if quick else 10.0)
    torch_bound = torch_bound or (4.0 if quick else 60.0)
    # Only rank 0 runs a world of 2: it hosts the store and waits for rank 1 until the deadline.
    missing = detection_figure("missing rank named", 0, deadline, repeats, torch_bound, names_missing_rank)
    # Rank 1 alone: nothing listens at MASTER_ADDR:MASTER_PORT. It prints its own report
    # (--all-ranks), since there is no rank 0 to print one.
    unreachable = detection_figure("unreachable master named", 1, deadline, repeats, torch_bound,
                                   names_unreachable_master, args=("--all-ranks",))
    return [missing, unreachable]


def main(argv: list[str] | None = None) -> int:
    parser = standard_arguments(__doc__)
    parser.add_argument("--deadline", type=float, help="distdoctor's --timeout (default 10 s; quick: 3 s + twice the time torch takes to import)")
    parser.add_argument("--torch-bound", type=float, help="how long plain torch is watched (default 60 s; quick 4 s)")
    args = parser.parse_args(argv)
    print_figures(measure(1 if args.quick else args.repeats, args.quick, args.deadline, args.torch_bound), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
