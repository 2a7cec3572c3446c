"""`python -m distdoctor` and the `distdoctor` command: signals watched and torch started first, then the CLI."""

from __future__ import annotations

import sys
from typing import Sequence

from distdoctor.core.interrupt import install_watcher, signal_name
from distdoctor.core.stages import CROSS_RANK_STAGES


def _starting(signum: int) -> None:
    sys.stderr.write(f"distdoctor: interrupted by {signal_name(signum)} while starting; no report was written\n")


def needs_torch_facts_only(argv: Sequence[str]) -> bool:
    """Whether the command line asks for a run that reads torch's facts but opens no process group:
    `check` whose every --stage is local, or `check ... -- <launch line>`, or `env`.

    A guess from the raw arguments, made before typer is even imported (that import is a tenth of
    the time the child needs for torch): a wrong "yes" costs a child that is killed at exit, a
    wrong "no" the import of torch in this process, as before.
    """
    if not argv or argv[0] not in ("check", "env") or "--help" in argv or "-h" in argv:
        return False
    if argv[0] == "env":
        return True
    stages: list[str] = []
    words = list(argv[1:])
    for at, word in enumerate(words):
        if word == "--":
            return True
        if word in ("--stage", "-s") and at + 1 < len(words):
            stages.extend(words[at + 1].split(","))
        elif word.startswith("--stage="):
            stages.extend(word.split("=", 1)[1].split(","))
    return bool(stages) and not any(stage.strip() in CROSS_RANK_STAGES for stage in stages)


# The commands that run torch code in this process or in the job's workers: below the oldest
# supported torch they refuse in one line (the others read logs, stacks or code, not torch).
RUNS_TORCH = ("check", "bench", "guard")


def refused(argv: Sequence[str]) -> str | None:
    """The line refusing this environment's torch for this command, or None."""
    if not argv or argv[0] not in RUNS_TORCH or "--help" in argv or "-h" in argv:
        return None
    from distdoctor.machine.torch_support import refusal  # reads torch's version.py, imports nothing heavy

    return refusal()


def main() -> None:
    """The console script."""
    install_watcher(default=_starting)
    line = refused(sys.argv[1:])
    if line is not None:
        sys.stderr.write(f"distdoctor: {line}\n")
        sys.exit(2)
    if needs_torch_facts_only(sys.argv[1:]):
        from distdoctor.machine.torch_facts import prefetch  # only for the runs that read torch's facts

        prefetch()
    from distdoctor.cli import run  # after the child is started: typer's import overlaps torch's

    run()


if __name__ == "__main__":
    main()
