"""The engine every way in shares: load the checks, run them on a context, build the report.

It runs the stages it is given on one context and never decides between a local run and a rank
of a world: distdoctor.dispatch does that.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from distdoctor.core.config import Config
from distdoctor.core.context import CheckContext
from distdoctor.core.redact import secret_values
from distdoctor.core.registry import REGISTRY, Registry, RegistryError
from distdoctor.core.report import Report, WorldSummary, build_report
from distdoctor.core.runner import Runner
import difflib


def load_registry(config: Config, registry: Registry | None = None) -> Registry:
    """The built-ins, the entry-point plugins and the --checks-dir files, loaded once each."""
    registry = registry or REGISTRY
    registry.load_builtins()
    registry.load_entry_points()
    for directory in config.checks_dirs:
        # Site files are vetted in a child process first, under the per-check deadline (at most
        # a quarter of the run's), so a file that blocks at import cannot hang this process and
        # the checks keep most of the run's time (docs/writing-checks.md).
        registry.load_checks_dir(directory, vet_timeout=min(config.check_timeout, config.timeout / 4))
    return registry


def select_checks(config: Config, registry: Registry, skip_tags: Sequence[str] = ()) -> list:
    """The checks a run will execute; RegistryError (a usage error) when there are none, since a
    run of zero checks would say "ok" about nothing (a mistyped --tag, an empty stage list)."""
    chosen = registry.select(config.stages, config.tags, skip_tags)
    if chosen or (skip_tags and registry.select(config.stages, config.tags)):
        return chosen  # a caller's skip_tags (preflight's network probes) may leave nothing: fine
    known = sorted({tag for c in registry.checks.values() for tag in c.tags})
    unknown = [t for t in config.tags if t not in known]
    if unknown:

        close = sorted({m for t in unknown for m in difflib.get_close_matches(t, known, n=2)})
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise RegistryError(f"--tag {', '.join(unknown)}: no check has this tag{hint}; known tags: {', '.join(known)}")
    raise RegistryError(
        f"no check matches stages {', '.join(config.stages)} and tags {', '.join(config.tags) or '(any)'}"
    )


def local_world_summary(ctx: CheckContext) -> WorldSummary:
    rank = ctx.rank
    return WorldSummary(
        size=ctx.world_size,
        launcher=ctx.launch.launcher,
        ranks_reported=(rank,) if rank is not None else (),
        ranks_missing=(),
    )


def report_from_runner(runner: Runner, ctx: CheckContext, world: WorldSummary | None = None, extra: Sequence[Any] = ()) -> Report:
    return build_report(
        [*runner.registry.load_problems, *runner.state.findings, *extra],
        [r.to_dict() for r in runner.state.results],
        world=world or local_world_summary(ctx),
        duration_s=runner.elapsed(),
        incomplete=runner.state.incomplete,
        silence=ctx.config.silence,
        secrets=secret_values(ctx.env),
    )


def diagnose(
    config: Config,
    ctx: CheckContext,
    *,
    registry: Registry | None = None,
    skip_tags: Sequence[str] = (),
    started: float | None = None,
) -> Report:
    """Run the selected stages on ``ctx`` and return the report (never prints).

    ``started`` (time.monotonic) is when the run's deadline starts counting: the process's
    start for the CLI, so that interpreter start-up and loading are inside ``--timeout``.
    """
    started = time.monotonic() if started is None else started
    registry = load_registry(config, registry)
    runner = Runner(registry, timeout=config.timeout, check_timeout=config.check_timeout, silence=config.silence)
    # Loading (and vetting site files) is inside the run's deadline.
    runner.started, runner.deadline = started, started + config.timeout
    runner.run(ctx, select_checks(config, registry, skip_tags), config.stages)
    return report_from_runner(runner, ctx)
