"""The dispatcher: a local run, the self-test world, or one rank of a world — decided here only.

A local-only run (the quick pre-job check) imports none of the cross-rank machinery (the store
exchange, the watchdog, the collectives): distdoctor.world is imported inside the functions.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from distdoctor.core.config import Config
from distdoctor.core.progress import PROGRESS
from distdoctor.core.registry import Registry
from distdoctor.core.stages import CROSS_RANK_STAGES
from distdoctor.core.report import Report
import dataclasses
import sys


def cross_rank_requested(config: Config) -> bool:
    return any(stage in config.stages for stage in CROSS_RANK_STAGES)


_importer: threading.Thread | None = None


def start_torch_import() -> threading.Thread:
    """Import torch on a thread (once per process), so that the self-test can wait for it with a
    deadline (1-7 s on a busy node). Returns the thread, to join with a deadline.

    Nothing else may import torch while it runs: a thread importing ``torch.distributed`` while
    torch's ``__init__`` is still running elsewhere finds a half-initialised ``torch`` in
    sys.modules, and torch's C++ init then aborts the process ("terminate called after throwing an
    instance of 'python_error'", seen as rank 0 of a world exiting -6 with no report). So only the
    self-test path starts it, and joins it before anything else touches torch."""
    global _importer
    if _importer is not None:
        return _importer

    def load() -> None:
        try:
            import torch  # noqa: F401
            import torch.distributed  # noqa: F401
        except BaseException:
            pass  # the checks that need torch say it is missing

    _importer = threading.Thread(target=load, name="distdoctor-import-torch", daemon=True)
    _importer.start()
    return _importer


def check_entry(
    config: Config,
    render: Callable[[Report], None],
    *,
    env: Mapping[str, str],
    argv: Sequence[str],
    all_ranks: bool = False,
    started: float | None = None,
    live: Any = None,
    launch_line: Sequence[str] = (),
) -> int:
    """The `distdoctor check` command: local only, the self-test world, or one rank of a world.

    Returns the exit code; as one rank of a world it ends the process itself (os._exit) once the
    report is out, since a process group whose peer hung can block interpreter teardown.
    """
    from distdoctor.machine.launchers import NONE, detect  # a local-only run loads nothing of the other paths

    # ``started`` is distdoctor's own clock (cli.STARTED): the deadline counts from there.
    started = time.monotonic() if started is None else started
    if launch_line:
        return check_launch_line(config, render, env=env, argv=argv, launch_line=launch_line, started=started)
    launch = detect(env, argv)
    if not cross_rank_requested(config):
        from distdoctor.machine.host import diagnose_here  # a local-only run loads nothing of the other paths

        PROGRESS.set_stage("local")
        report = diagnose_here(config, env=env, argv=argv, started=started)
        render(report)
        return report.exit_code(config.fail_level)
    if launch.launcher == NONE:
        from distdoctor.world.rank_state import working_reserve  # the cross-rank machinery stays off the local-only path
        from distdoctor.world.selftest import out_of_time_report, run_selftest  # the cross-rank machinery stays off the local-only path

        PROGRESS.set_stage("start-up (importing torch)")
        importer = start_torch_import()
        # Meanwhile the built-in checks, which every forked rank would otherwise import for itself:
        # none imports torch at import time (plugins and site files may: each rank loads those).
        from distdoctor.core.registry import REGISTRY  # the cross-rank machinery stays off the local-only path

        REGISTRY.load_builtins()
        importer.join(max(started + config.timeout - working_reserve(config.timeout) - time.monotonic(), 0.0))
        if importer.is_alive():
            # torch did not load within the deadline: say so now rather than past the deadline.
            report = out_of_time_report(config, started, size=config.nproc or 2, argv=list(argv),
                                        stage="local", why="torch was still being imported")
            render(report)
            from distdoctor.world.watchdog import flush_std_streams  # the cross-rank machinery stays off the local-only path

            flush_std_streams()
            os._exit(report.exit_code(config.fail_level))  # the import thread cannot be stopped
        code = run_selftest(config, render, nproc=config.nproc, all_ranks=all_ranks, started=started,
                            argv=list(argv), live=live)
        if live is not None:
            live.stop()
        from distdoctor.world.watchdog import flush_std_streams  # the cross-rank machinery stays off the local-only path

        flush_std_streams()
        # The report is out: skip the interpreter's teardown of torch (0.35-0.45 s on a 2-core node).
        os._exit(code)
    from distdoctor.world.rank_run import run_rank  # the cross-rank machinery stays off the local-only path
    from distdoctor.world.watchdog import flush_std_streams  # the cross-rank machinery stays off the local-only path

    if live is not None and launch.rank.value not in (0, None):
        live.stop()  # one status line per world: rank 0's
    outcome = run_rank(config, env=env, argv=argv, all_ranks=all_ranks, emit=render, started=started,
                       note=_note_to_stderr)
    if outcome.world_opened or outcome.world_described:
        flush_std_streams()
        os._exit(outcome.exit_code)
    return outcome.exit_code


def check_launch_line(
    config: Config,
    render: Callable[[Report], None],
    *,
    env: Mapping[str, str],
    argv: Sequence[str],
    launch_line: Sequence[str],
    started: float | None = None,
) -> int:
    """`distdoctor check -- torchrun ...`: this node's local checks against the world the line
    will form, before the launcher runs. Raises LaunchLineError for a line it cannot read."""

    from distdoctor.machine.host import diagnose_here  # a local-only run loads nothing of the other paths
    from distdoctor.machine.launch_line import parse_launch_line  # a local-only run loads nothing of the other paths
    from distdoctor.machine.launchers import TORCHRUN, planned_launch  # a local-only run loads nothing of the other paths
    from distdoctor.machine.probes import Probes  # a local-only run loads nothing of the other paths
    from distdoctor.machine.torchrun_env import worker_thread_default  # a local-only run loads nothing of the other paths

    plan = parse_launch_line(list(launch_line))
    probes = Probes()
    gpus = probes.gpus() if plan.launcher == TORCHRUN or plan.inner is not None else []
    launch = planned_launch(plan, env, len(gpus) if isinstance(gpus, list) else None)
    planned_env = dict(env)
    if launch.launcher == TORCHRUN:
        planned_env.update(worker_thread_default(planned_env, launch.local_world_size.value or 1))
    local_only = dataclasses.replace(config, stages=("local",))
    report = diagnose_here(local_only, env=planned_env, argv=argv, probes=probes, launch=launch, started=started)
    render(report)
    return report.exit_code(config.fail_level)


def _note_to_stderr(line: str) -> None:
    # A rank other than 0 points at rank 0's report in one line, on stderr: stdout carries
    # exactly one report (rank 0's), also in --format json.

    sys.stderr.write(line + "\n")


def diagnose(
    config: Config,
    *,
    env: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
    registry: Registry | None = None,
) -> Report:
    """A report for an embedded caller (the pytest plugin): this process's local run, or its part
    as one rank of the world its environment describes when a cross-rank stage is selected."""

    from distdoctor.machine.host import diagnose_here  # a local-only run loads nothing of the other paths
    from distdoctor.machine.launchers import detect  # a local-only run loads nothing of the other paths

    env = dict(os.environ if env is None else env)
    argv = tuple(sys.argv if argv is None else argv)
    if cross_rank_requested(config) and detect(env, argv).world_configured:
        # Imported here: a local run never loads the cross-rank machinery.
        from distdoctor.world.rank_run import run_rank

        return run_rank(config, env=env, argv=argv, registry=registry, watchdog=False, teardown=True).report
    return diagnose_here(config, env=env, argv=argv, registry=registry)


def load_every_kind(config: Config) -> Registry:
    """The registry with every finding ID declared: the checks', and those only `explain` (log.*),
    the embedded API (pre.*, init.*, spec.*, guard.*), `bench` (bench.*), `lint` (lint.*), `stacks` (stacks.*), the job diagnosis (job.*) and the guard's pace (slow.*) emit — for
    `list`, `show` and the docs."""
    from distdoctor.core.engine import load_registry  # a local-only run loads nothing of the other paths

    # Importing these registers their kinds; none of them imports torch at import time.
    import distdoctor.bench.kinds  # noqa: F401
    import distdoctor.diagnosis.kinds  # noqa: F401
    import distdoctor.diagnosis.pace_kinds  # noqa: F401
    import distdoctor.embedded.bounded_init  # noqa: F401
    import distdoctor.embedded.guard.findings  # noqa: F401
    import distdoctor.embedded.setup_checks  # noqa: F401
    import distdoctor.explain  # noqa: F401
    import distdoctor.lint  # noqa: F401
    import distdoctor.stacks  # noqa: F401

    return load_registry(config)
