"""The engine every way in shares: load the checks, build the context, run, build the report."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from distdoctor.config import Config
from distdoctor.context import CheckContext, build_context
from distdoctor.probes import Probes
from distdoctor.redact import secret_values
from distdoctor.registry import REGISTRY, Registry
from distdoctor.report import Report, WorldSummary, build_report
from distdoctor.runner import Runner


def load_registry(config: Config, registry: Registry | None = None, *, every_kind: bool = False) -> Registry:
    """The built-ins, the entry-point plugins and the --checks-dir files, loaded once each.

    ``every_kind`` also declares the finding IDs that only `distdoctor explain` (log.*) and the
    embedded API (pre.*, init.*) emit, for `list`, `show` and the docs; a check run does not
    need them and skips their import.
    """
    registry = registry or REGISTRY
    if every_kind:
        # Importing these registers their kinds; none of them imports torch at import time.
        import distdoctor.bench.kinds  # noqa: F401
        import distdoctor.explain  # noqa: F401
        import distdoctor.guarded_init  # noqa: F401
        import distdoctor.preflight_checks  # noqa: F401
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
    *,
    env: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
    probes: Probes | None = None,
    registry: Registry | None = None,
    world: Any = None,
    skip_tags: Sequence[str] = (),
) -> Report:
    """Run the selected stages on this process and return the report (never prints).

    When the environment describes a world (a launcher's or variables set by hand) and a
    cross-rank stage is selected, this process takes part as its rank (distdoctor.crossrank):
    rank 0's report covers the whole world, the others' their own part.
    """
    if world is None and _describes_world(config, env, argv):
        from distdoctor.crossrank import run_rank

        return run_rank(config, env=env, argv=argv, probes=probes, registry=registry, watchdog=False, teardown=True).report
    registry = load_registry(config, registry)
    ctx = build_context(config, env=env, argv=argv, probes=probes, world=world)
    runner = Runner(registry, timeout=config.timeout, check_timeout=config.check_timeout, silence=config.silence)
    runner.run(ctx, registry.select(config.stages, config.tags, skip_tags), config.stages)
    return report_from_runner(runner, ctx)


def _describes_world(config: Config, env: Mapping[str, str] | None, argv: Sequence[str] | None) -> bool:
    import os
    import sys

    from distdoctor.entry import cross_rank_requested
    from distdoctor.launchers import detect

    if not cross_rank_requested(config):
        return False
    return detect(dict(os.environ if env is None else env), tuple(sys.argv if argv is None else argv)).world_configured
