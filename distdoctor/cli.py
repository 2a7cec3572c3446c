"""The `distdoctor` command. Logic lives in the engine; errors become exit codes only here."""

from __future__ import annotations

import time

# distdoctor's own clock, read before anything heavy is imported: the run's deadline counts from
# here. Never from the process's start time: `bash -c "pip install ... && distdoctor check"` and
# `exec distdoctor check` run distdoctor in a process that may have lived for minutes already.
STARTED = time.monotonic()

import sys  # noqa: E402


def _invoked_as_check(argv: list[str]) -> bool:
    """`distdoctor [--local-rank=N] check ...`: the first word that is not an option."""
    words = [a for a in argv[1:] if not a.startswith("-")]
    return bool(words) and words[0] == "check"


if _invoked_as_check(sys.argv):
    # torch (1-7 s to import) starts loading now, on a thread, while the command line is parsed
    # (typer alone takes 0.1-0.3 s) and the checks that need no torch run.
    from distdoctor.dispatch import start_torch_import

    start_torch_import()

import json  # noqa: E402
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from distdoctor import __version__
from distdoctor.core.config import OPTIONS, ConfigError, load_config
from distdoctor.core.report import EXIT_USAGE

app = typer.Typer(
    name="distdoctor",
    help="Find out why a PyTorch distributed job will fail or hang, and what to do about it.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=False,
)

RUN_PANEL = "What to run"
OUTPUT_PANEL = "Output"
POLICY_PANEL = "Policy"
WORLD_PANEL = "World (by hand)"
# The smallest --timeout `check` accepts, and the largest (a week): outside, a usage error.
MIN_TIMEOUT_S = 1.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def _help(name: str) -> str:
    return OPTIONS[name].help


def _version(value: bool) -> None:
    if value:
        typer.echo(f"distdoctor {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    # torch.distributed.launch puts --local-rank=N right after `-m distdoctor`, before the command.
    local_rank: Annotated[Optional[str], typer.Option("--local-rank", "--local_rank", hidden=True)] = None,
) -> None:
    """distdoctor: diagnostics for torch.distributed jobs."""


def fail_usage(message: str) -> None:
    typer.echo(f"distdoctor: error: {message}", err=True)
    raise typer.Exit(EXIT_USAGE)


def check_timeout_bounds(timeout: float, source: str) -> None:
    """An absurd deadline is a usage error: too short to do anything, or too long to be meant."""
    if not MIN_TIMEOUT_S <= timeout <= MAX_TIMEOUT_S:
        fail_usage(f"{source}: a timeout of {timeout:g}s is out of range: distdoctor needs at least "
                   f"{MIN_TIMEOUT_S:g}s to report anything, and at most {MAX_TIMEOUT_S:g}s (a week) is accepted "
                   "(the default is 60s)")


def emit(text: str | None, output: Path | None) -> None:
    """Write a rendered report to --output (or stdout), turning I/O errors into usage errors."""
    if text is None:
        return
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return
    try:
        output.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    except OSError as exc:
        fail_usage(f"cannot write --output {output}: {exc.strerror or exc}")


def render_report(report: Any, fmt: str, output: Path | None, *, verbose: bool, quiet: bool) -> None:
    from distdoctor.core.render import render
    from distdoctor.machine.snapshot import report_facts

    if report.about is None:
        report.about = report_facts()

    if fmt == "rich" and output is not None:
        import io

        buffer = io.StringIO()
        render(report, "rich", buffer, verbose=verbose, quiet=quiet)
        emit(buffer.getvalue(), output)
    else:
        emit(render(report, fmt, verbose=verbose, quiet=quiet), output)


@app.command()
def check(
    stage: Annotated[Optional[list[str]], typer.Option("--stage", "-s", help=_help("stages"), rich_help_panel=RUN_PANEL)] = None,
    tag: Annotated[Optional[list[str]], typer.Option("--tag", "-t", help=_help("tags"), rich_help_panel=RUN_PANEL)] = None,
    checks_dir: Annotated[Optional[list[Path]], typer.Option("--checks-dir", help=_help("checks_dirs"), rich_help_panel=RUN_PANEL)] = None,
    backend: Annotated[Optional[str], typer.Option("--backend", help=_help("backend"), rich_help_panel=RUN_PANEL)] = None,
    nproc: Annotated[Optional[int], typer.Option("--nproc", help=_help("nproc"), rich_help_panel=RUN_PANEL)] = None,
    init_method: Annotated[Optional[str], typer.Option("--init-method", help=_help("init_method"), rich_help_panel=RUN_PANEL)] = None,
    pg_timeout: Annotated[Optional[float], typer.Option("--pg-timeout", help=_help("pg_timeout"), rich_help_panel=RUN_PANEL)] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", help=_help("timeout"), rich_help_panel=POLICY_PANEL)] = None,
    check_timeout: Annotated[Optional[float], typer.Option("--check-timeout", help=_help("check_timeout"), rich_help_panel=POLICY_PANEL)] = None,
    fail_level: Annotated[Optional[str], typer.Option("--fail-level", help=_help("fail_level"), rich_help_panel=POLICY_PANEL)] = None,
    silence: Annotated[Optional[list[str]], typer.Option("--silence", help=_help("silence"), rich_help_panel=POLICY_PANEL)] = None,
    fmt: Annotated[Optional[str], typer.Option("--format", "-f", help=_help("format"), rich_help_panel=OUTPUT_PANEL)] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report to this file instead of stdout.", rich_help_panel=OUTPUT_PANEL)] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also list every check with its status and time.", rich_help_panel=OUTPUT_PANEL)] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only errors and the summary line.", rich_help_panel=OUTPUT_PANEL)] = False,
    all_ranks: Annotated[bool, typer.Option("--all-ranks", help="Every rank prints its own report too (by default only rank 0 reports, for the whole world).", rich_help_panel=OUTPUT_PANEL)] = False,
    rank: Annotated[Optional[int], typer.Option("--rank", help="This process's rank, as RANK would set it (for worlds started by hand).", rich_help_panel=WORLD_PANEL)] = None,
    world_size: Annotated[Optional[int], typer.Option("--world-size", help="The number of ranks, as WORLD_SIZE would set it.", rich_help_panel=WORLD_PANEL)] = None,
    master_addr: Annotated[Optional[str], typer.Option("--master-addr", help="Rank 0's host, as MASTER_ADDR would set it.", rich_help_panel=WORLD_PANEL)] = None,
    master_port: Annotated[Optional[int], typer.Option("--master-port", help="The rendezvous port on rank 0's host, as MASTER_PORT would set it.", rich_help_panel=WORLD_PANEL)] = None,
    # The deprecated torch.distributed.launch appends --local-rank=N (--local_rank before 2.0);
    # accepted so that the launch checks, which read argv, can report that launcher.
    local_rank: Annotated[Optional[str], typer.Option("--local-rank", "--local_rank", hidden=True)] = None,
) -> None:
    """Diagnose this node (and, with a launcher or --nproc, the whole world).

    Exit codes: 0 nothing at or above --fail-level; 1 findings at or above it; 2 usage error;
    3 the diagnosis was cut off by its deadline (partial report); 130 interrupted by SIGINT,
    143 by SIGTERM (partial report, or one line naming the stage).
    """
    try:
        config = load_config(
            {
                "stages": stage,
                "tags": tag,
                "checks_dirs": [str(p) for p in checks_dir] if checks_dir else None,
                "backend": backend,
                "nproc": nproc,
                "timeout": timeout,
                "check_timeout": check_timeout,
                "fail_level": fail_level,
                "silence": silence,
                "format": fmt,
                "init_method": init_method,
                "pg_timeout": pg_timeout,
            }
        )
    except ConfigError as exc:
        fail_usage(str(exc))
    check_timeout_bounds(config.timeout, config.sources.get("timeout", "--timeout"))
    import functools
    import os

    from distdoctor.dispatch import check_entry
    from distdoctor.machine.launchers import NONE, detect
    from distdoctor.core.registry import RegistryError

    started = STARTED
    # Given by hand, the world options act exactly like the variables they stand for.
    by_hand = {"RANK": rank, "WORLD_SIZE": world_size, "MASTER_ADDR": master_addr, "MASTER_PORT": master_port}
    env = {**os.environ, **{k: str(v) for k, v in by_hand.items() if v is not None}}
    if nproc is not None and detect(env, sys.argv).launcher != NONE:
        fail_usage("--nproc starts a self-test world on this node; under a launcher every process is already one rank")
    from distdoctor.core.progress import PROGRESS, LiveStatus, live_wanted

    PROGRESS.start(started, config.timeout)
    live = LiveStatus(live_wanted(config.format, quiet)).start()
    render = live.wrap(functools.partial(render_report, fmt=config.format, output=output, verbose=verbose, quiet=quiet))
    try:
        code = check_entry(config, render, env=env, argv=sys.argv, all_ranks=all_ranks, started=started, live=live)
    except RegistryError as exc:
        live.stop()
        fail_usage(str(exc))
    finally:
        live.stop()
    raise typer.Exit(code)


def say_interrupted(signum: int) -> None:
    """No report can be built here (distdoctor was starting, or ran the local stage on its own):
    one line on stderr names where it was; the exit code is 128 + the signal's number."""
    from distdoctor.core.interrupt import signal_name
    from distdoctor.core.progress import stop_live, where_now

    stop_live()
    sys.stderr.write(f"distdoctor: interrupted by {signal_name(signum)} in {where_now()}, "
                     f"{time.monotonic() - STARTED:.1f}s after it started; no report was written\n")


@app.command("list")
def list_checks(
    checks_dir: Annotated[Optional[list[Path]], typer.Option("--checks-dir", help=_help("checks_dirs"))] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="rich or json.")] = "rich",
) -> None:
    """List every check and every finding ID with its cause and title."""
    from distdoctor.core.config import Config
    from distdoctor.dispatch import load_every_kind
    from distdoctor.core.registry import RegistryError

    if fmt not in ("rich", "json"):
        fail_usage(f"--format: expected rich or json, got {fmt!r}")
    try:
        registry = load_every_kind(Config(checks_dirs=tuple(str(p) for p in checks_dir or ())))
    except RegistryError as exc:
        fail_usage(str(exc))
    checks = [c.describe() for c in registry.checks.values()]
    kinds = [k.describe() for k in sorted(registry.kinds.values(), key=lambda k: k.id)]
    if fmt == "json":
        problems = [p.to_dict() for p in registry.load_problems]
        emit(json.dumps({"checks": checks, "findings": kinds, "load_problems": problems}, indent=2), None)
        return
    from rich.table import Table

    from distdoctor.core.render import make_console

    console = make_console()
    table = Table(title="Checks", show_lines=False)
    for column in ("check", "stage", "tags", "emits"):
        table.add_column(column)
    for c in checks:
        table.add_row(c["name"], c["stage"], ",".join(c["tags"]), ", ".join(c["emits"]))
    console.print(table)
    table = Table(title="Finding IDs")
    for column in ("ID", "severity", "cause", "title"):
        table.add_column(column)
    for k in kinds:
        table.add_row(k["id"], k["severity"], k["cause"], k["title"])
    console.print(table)
    for problem in registry.load_problems:
        console.print(f"[red]{problem.title}[/red]: {problem.detail}")


@app.command()
def show(finding_id: Annotated[str, typer.Argument(help="A finding ID, e.g. launch.C001.")]) -> None:
    """Show the documentation of a finding ID."""
    import difflib

    from distdoctor.core.config import Config
    from distdoctor.core.docs import finding_doc, finding_sections
    from distdoctor.dispatch import load_every_kind

    registry = load_every_kind(Config())
    kind = registry.kinds.get(finding_id)
    doc = finding_doc(finding_id)
    if kind is None and doc is None:
        known = sorted(set(registry.kinds) | set(finding_sections()))
        close = difflib.get_close_matches(finding_id, known, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else " (distdoctor list shows them all)"
        fail_usage(f"unknown finding ID {finding_id!r}{hint}")
    if kind is not None:
        typer.echo(f"{kind.id}  [{kind.severity.label}, cause: {kind.cause}]")
        typer.echo(f"{kind.title}")
        typer.echo(f"hint: {kind.hint}")
        typer.echo("")
    typer.echo(doc if doc else "(no documentation page found for this ID in this installation)")


@app.command()
def env(
    fmt: Annotated[str, typer.Option("--format", "-f", help="rich or json.")] = "rich",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the snapshot to this file.")] = None,
) -> None:
    """Print a snapshot of this process's distributed set-up for bug reports (secrets redacted)."""
    from distdoctor.machine.host import build_context
    from distdoctor.machine.snapshot import collect_snapshot

    if fmt not in ("rich", "json"):
        fail_usage(f"--format: expected rich or json, got {fmt!r}")
    try:
        config = load_config()
    except ConfigError as exc:
        fail_usage(str(exc))
    snapshot = collect_snapshot(build_context(config))
    if fmt == "json":
        emit(json.dumps(snapshot, indent=2, default=str), output)
        return
    lines: list[str] = []
    for key, value in snapshot.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            for k, v in value.items():
                lines.append(f"  {k}: {json.dumps(v, default=str) if isinstance(v, (dict, list)) else v}")
        elif isinstance(value, list):
            lines.append(f"{key}:" + ("" if value else " none"))
            lines += [f"  - {json.dumps(v, default=str)}" for v in value]
        else:
            lines.append(f"{key}: {value}")
    emit("\n".join(lines), output)


@app.command()
def explain(
    files: Annotated[list[str], typer.Argument(help="Log files (one log, or one per rank), or - to read stdin.", show_default=False)],
    fmt: Annotated[Optional[str], typer.Option("--format", "-f", help=_help("format"), rich_help_panel=OUTPUT_PANEL)] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report to this file instead of stdout.", rich_help_panel=OUTPUT_PANEL)] = None,
    fail_level: Annotated[Optional[str], typer.Option("--fail-level", help=_help("fail_level"), rich_help_panel=POLICY_PANEL)] = None,
    silence: Annotated[Optional[list[str]], typer.Option("--silence", help=_help("silence"), rich_help_panel=POLICY_PANEL)] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every detail line and the files read.", rich_help_panel=OUTPUT_PANEL)] = False,
) -> None:
    """Name the cause of a failed job from its logs (torchrun output, per-rank logs, NCCL/Gloo errors).

    Each finding carries a confidence; a text with several possible causes lists them as
    candidates and says what to run to tell them apart. Exit codes: 0 nothing at or above
    --fail-level; 1 a cause was found at or above it; 2 unreadable input or usage error.
    """
    try:
        config = load_config({"format": fmt, "fail_level": fail_level, "silence": silence})
    except ConfigError as exc:
        fail_usage(str(exc))
    from distdoctor.explain import LogInputError, explain_files

    try:
        report = explain_files(files, silence=config.silence)
    except LogInputError as exc:
        fail_usage(str(exc))
    render_report(report, config.format, output, verbose=verbose, quiet=False)
    raise typer.Exit(report.exit_code(config.fail_level))


def run() -> None:
    """Console-script entry point: usage errors exit 2, never a traceback; SIGINT/SIGTERM end the
    process with 130/143 after a last word (see distdoctor.core.interrupt)."""
    from distdoctor.core.interrupt import install_watcher

    install_watcher(default=say_interrupted)
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("distdoctor: interrupted", err=True)
        sys.exit(130)
