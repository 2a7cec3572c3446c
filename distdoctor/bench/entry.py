"""What `distdoctor bench` runs: the self-test world on this node, or one rank of a launcher's world."""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence

from distdoctor.bench.settings import BenchSettings
from distdoctor.machine.launchers import NONE, detect


class BenchUsageError(ValueError):
    """The environment or the options cannot start a bench; the CLI exits 2 with the message."""


def bench_entry(settings: BenchSettings, render: Callable[[Any], None], *, env: Mapping[str, str],
                argv: Sequence[str], started: float) -> int:
    """Run the bench; returns the exit code. As one rank of a world the process ends itself
    (os._exit) once the report is out: a process group whose peer hung can block teardown."""
    from distdoctor.bench.rank import run_bench_rank  # loaded only when this path runs

    launch = detect(env, argv)
    if launch.launcher == NONE:
        from distdoctor.world.selftest import run_selftest  # the cross-rank machinery stays off the local-only path

        return run_selftest(settings, render, nproc=settings.nproc, started=started, argv=list(argv),
                            rank_body=run_bench_rank)
    if settings.nproc is not None:
        raise BenchUsageError("--nproc starts a self-test world on this node; under a launcher every process is already one rank")
    if not launch.world_configured:
        raise BenchUsageError(f"the environment ({launch.title}) does not describe a usable world: RANK, WORLD_SIZE, "
                              "MASTER_ADDR and MASTER_PORT must all be set (`distdoctor check` says what is wrong)")
    from distdoctor.world.watchdog import flush_std_streams  # the cross-rank machinery stays off the local-only path

    outcome = run_bench_rank(settings, env=env, argv=argv, emit=render, started=started)
    flush_std_streams()
    os._exit(outcome.exit_code)
