"""This host's view as a CheckContext (environment, argv, launcher, probes), and a local run on it."""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Sequence

from distdoctor.core.config import Config
from distdoctor.core.context import CheckContext
from distdoctor.core.engine import diagnose
from distdoctor.core.registry import Registry
from distdoctor.core.report import Report
from distdoctor.machine.launchers import LaunchInfo, detect
from distdoctor.machine.probes import Probes


def build_context(
    config: Config,
    env: Mapping[str, str] | None = None,
    argv: tuple[str, ...] | list[str] | None = None,
    probes: Probes | None = None,
    world: Any = None,
    launch: LaunchInfo | None = None,
) -> CheckContext:
    env_snapshot = dict(os.environ if env is None else env)
    argv_snapshot = tuple(sys.argv if argv is None else argv)
    return CheckContext(
        env=env_snapshot,
        argv=argv_snapshot,
        config=config,
        launch=launch or detect(env_snapshot, argv_snapshot),
        probes=probes or Probes(),
        world=world,
    )


def diagnose_here(
    config: Config,
    *,
    env: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
    probes: Probes | None = None,
    registry: Registry | None = None,
    skip_tags: Sequence[str] = (),
    launch: LaunchInfo | None = None,
    started: float | None = None,
) -> Report:
    """The selected stages run on this process alone (never as a rank of a world); ``launch``
    stands for what the environment says (a launch line checked before it runs)."""
    ctx = build_context(config, env=env, argv=argv, probes=probes, launch=launch)
    return diagnose(config, ctx, registry=registry, skip_tags=skip_tags, started=started)
