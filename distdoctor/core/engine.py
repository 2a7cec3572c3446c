"""The engine every way in shares: load the checks, run them on a context, build the report.

It runs the stages it is given on one context and never decides between a local run and a rank
of a world: distdoctor.dispatch does that.
"""

from __future__ import annotations

from typing import Any, Sequence

from distdoctor.core.config import Config
from distdoctor.core.context import CheckContext
from distdoctor.core.redact import secret_values
from distdoctor.core.registry import REGISTRY, Registry
from distdoctor.core.report import Report, WorldSummary, build_report
from distdoctor.core.runner import Runner


def load_registry(config: Config, registry: Registry | None = None) -> Registry:
    """The built-ins, the entry-point plugins and the --checks-dir files, loaded once each."""
    registry = registry or REGISTRY
    registry.load_builtins()
    registry.load_entry_points()
    for directory in config.checks_dirs:
        registry.load_checks_dir(directory)
    return registry


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
) -> Report:
    """Run the selected stages on ``ctx`` and return the report (never prints)."""
    registry = load_registry(config, registry)
    runner = Runner(registry, timeout=config.timeout, check_timeout=config.check_timeout, silence=config.silence)
    runner.run(ctx, registry.select(config.stages, config.tags, skip_tags), config.stages)
    return report_from_runner(runner, ctx)
