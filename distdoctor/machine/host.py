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
from distdoctor.machine.launchers import detect
from distdoctor.machine.probes import Probes


def build_context(
    config: Config,
    env: Mapping[str, str] | None = None,
    argv: tuple[str, ...] | list[str] | None = None,
    probes: Probes | None = None,
    world: Any = None,
) -> CheckContext:
    env_snapshot = dict(os.environ if env is None else env)
    argv_snapshot = tuple(sys.argv if argv is None else argv)
    return CheckContext(
        env=env_snapshot,
        argv=argv_snapshot,
        config=config,
        launch=detect(env_snapshot, argv_snapshot),
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
    started: float | None = None,
) -> Report:
    """The selected stages run on this process alone (never as a rank of a world)."""
    ctx = build_context(config, env=env, argv=argv, probes=probes)
    return diagnose(config, ctx, registry=registry, skip_tags=skip_tags, started=started)
