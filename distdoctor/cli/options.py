"""The CLI's options: help and defaults from the configuration's OPTIONS, usage errors, deadlines' bounds."""

from __future__ import annotations

import os
from typing import Any

import typer

from distdoctor.core.config import OPTIONS, ConfigError, load_config
from distdoctor.core.report import EXIT_USAGE

RUN_PANEL = "What to run"
OUTPUT_PANEL = "Output"
POLICY_PANEL = "Policy"
WORLD_PANEL = "World (by hand)"
# The smallest --timeout `check` accepts, and the largest (a week): outside, a usage error.
MIN_TIMEOUT_S = 1.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def _help(name: str) -> str:
    return OPTIONS[name].help


def _default_text(name: str) -> str | None:
    """How --help shows an option's default (the value used when neither the command line,
    DISTDOCTOR_* nor [tool.distdoctor] sets it)."""
    default = OPTIONS[name].default
    if name in ("timeout", "check_timeout"):
        return f"{default:g}s"
    if isinstance(default, tuple):
        return ", ".join(map(str, default)) if default else None
    if default is None:
        return None
    return str(getattr(default, "label", default))


# Each configuration setting's long flag (stages -> --stage): errors name what the user typed.
CLI_FLAGS: dict[str, str] = {}


def _option(name: str, *flags: str, panel: str | None = None, metavar: str | None = None) -> Any:
    """A typer option for a configuration setting: its help and its default, from OPTIONS."""
    CLI_FLAGS[name] = flags[0]
    default = _default_text(name)
    # Written into the help itself: typer shows a custom default text as "(60s)".
    text = f"{_help(name)} [dim]\\[default: {default}][/dim]" if default else _help(name)
    return typer.Option(*flags, help=text, rich_help_panel=panel, show_default=False, metavar=metavar)


def fail_usage(message: str) -> None:
    typer.echo(f"distdoctor: error: {message}", err=True)
    raise typer.Exit(EXIT_USAGE)


def check_timeout_bounds(timeout: float, source: str) -> None:
    """An absurd deadline is a usage error: too short to do anything, or too long to be meant."""
    if not MIN_TIMEOUT_S <= timeout <= MAX_TIMEOUT_S:
        fail_usage(f"{source}: a timeout of {timeout:g}s is out of range: distdoctor needs at least "
                   f"{MIN_TIMEOUT_S:g}s to report anything, and at most {MAX_TIMEOUT_S:g}s (a week) is accepted "
                   "(the default is 60s)")


def load_check_config(options: dict[str, Any]) -> Any:
    """The check command's configuration; a bad value (or an absurd deadline) is a usage error."""
    try:
        config = load_config(options, cli_flags=CLI_FLAGS)
    except ConfigError as exc:
        fail_usage(str(exc))
    check_timeout_bounds(config.timeout, config.sources.get("timeout", "--timeout"))
    return config


def by_hand_env(**world: Any) -> dict[str, str]:
    """The environment with the world options given by hand, which act exactly like the
    variables they stand for (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    names = {"rank": "RANK", "world_size": "WORLD_SIZE", "master_addr": "MASTER_ADDR", "master_port": "MASTER_PORT"}
    return {**os.environ, **{names[k]: str(v) for k, v in world.items() if v is not None}}
