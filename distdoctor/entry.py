"""What `distdoctor check` runs: the local stage alone, the self-test world, or one rank of a world.

Kept apart from distdoctor.crossrank so that a local-only run (the quick pre-job check) imports
none of the cross-rank machinery: the store exchange, the watchdog, the collectives.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Mapping, Sequence

from distdoctor.config import Config
from distdoctor.report import Report

CROSS_RANK_STAGES = ("rendezvous", "collective")


def cross_rank_requested(config: Config) -> bool:
    return any(stage in config.stages for stage in CROSS_RANK_STAGES)


def process_started(clock: Callable[[], float] = time.monotonic) -> float:
    """When this process started, on ``clock``: the run's deadline counts from there, so the
    time spent importing torch is inside it (the user's --timeout is wall time)."""
    age = _process_age()
    return clock() - age if age is not None and 0 <= age < 600 else clock()


def _process_age() -> float | None:
    # /proc gives the start in clock ticks since boot and the uptime in 1/100 s: both exact to
    # 10 ms (psutil's create_time adds the boot time, which /proc/stat rounds to a second).
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        with open("/proc/uptime", "rb") as fh:
            uptime = float(fh.read().split()[0])
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return time.time() - psutil.Process().create_time()
    except Exception:
        return None


def check_entry(
    config: Config,
    render: Callable[[Report], None],
    *,
    env: Mapping[str, str],
    argv: Sequence[str],
    all_ranks: bool = False,
    started: float | None = None,
) -> int:
    """The `distdoctor check` command: local only, the self-test world, or one rank of a world.

    Returns the exit code; as one rank of a world it ends the process itself (os._exit) once the
    report is out, since a process group whose peer hung can block interpreter teardown.
    """
    from distdoctor.launchers import NONE, detect

    started = process_started() if started is None else started
    launch = detect(env, argv)
    if not cross_rank_requested(config):
        from distdoctor.engine import diagnose

        report = diagnose(config, env=env, argv=argv)
        render(report)
        return report.exit_code(config.fail_level)
    if launch.launcher == NONE:
        from distdoctor.selftest import run_selftest

        return run_selftest(config, render, nproc=config.nproc, all_ranks=all_ranks, started=started, argv=list(argv))
    from distdoctor.crossrank import run_rank
    from distdoctor.watchdog import flush_std_streams

    outcome = run_rank(config, env=env, argv=argv, all_ranks=all_ranks, emit=render, started=started)
    if outcome.world_opened or outcome.world_described:
        flush_std_streams()
        os._exit(outcome.exit_code)
    return outcome.exit_code
