"""The `distdoctor` command. Logic lives in the engine; errors become exit codes only here."""

from __future__ import annotations

import time

# distdoctor's own clock, read before anything heavy is imported: the run's deadline counts from
# here. Never from the process's start time: `bash -c "pip install ... && distdoctor check"` and
# `exec distdoctor check` run distdoctor in a process that may have lived for minutes already.
STARTED = time.monotonic()
# True while the process runs as the `distdoctor` command (run(), the console script and
# `python -m distdoctor`) and its first command has not started yet.
_first_command = [False]


def command_started() -> float:
    """When this command started: STARTED for the `distdoctor` process's first command, and now
    for a command of the app invoked in-process (as tests do), whose deadline must not count the
    time since the module was imported."""
    if _first_command[0]:
        _first_command[0] = False
        return STARTED
    return time.monotonic()

import difflib  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Any, Optional  # noqa: E402

import typer  # noqa: E402

from distdoctor import __version__  # noqa: E402
from distdoctor.cli.options import (CLI_FLAGS, OUTPUT_PANEL, POLICY_PANEL, RUN_PANEL, WORLD_PANEL,  # noqa: E402
                                    _help, _option, by_hand_env, fail_usage, load_check_config)
from distdoctor.cli.output import (check_markdown, emit, plain_columns, print_table,  # noqa: E402,F401
                                   render_bench_report, render_report, show_markdown)
from distdoctor.cli.watching import check_stacks_options, watch_stacks  # noqa: E402
from distdoctor.core.config import ConfigError, load_config  # noqa: E402
from distdoctor.core.interrupt import install_watcher, signal_name  # noqa: E402
from distdoctor.core.progress import PROGRESS, LiveStatus, live_wanted, stop_live, where_now  # noqa: E402

app = typer.Typer(
    name="distdoctor",
    help="Find out why a PyTorch distributed job will fail or hang, and what to do about it.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=False,
)


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


@app.command()
def check(
    stage: Annotated[Optional[list[str]], _option("stages", "--stage", "-s", panel=RUN_PANEL, metavar="STAGE")] = None,
    tag: Annotated[Optional[list[str]], _option("tags", "--tag", "-t", panel=RUN_PANEL, metavar="TAG")] = None,
    checks_dir: Annotated[Optional[list[Path]], _option("checks_dirs", "--checks-dir", panel=RUN_PANEL, metavar="DIR")] = None,
    backend: Annotated[Optional[str], _option("backend", "--backend", panel=RUN_PANEL, metavar="BACKEND")] = None,
    nproc: Annotated[Optional[int], _option("nproc", "--nproc", panel=RUN_PANEL, metavar="N")] = None,
    init_method: Annotated[Optional[str], _option("init_method", "--init-method", panel=RUN_PANEL, metavar="URL")] = None,
    pg_timeout: Annotated[Optional[float], _option("pg_timeout", "--pg-timeout", panel=RUN_PANEL, metavar="SECONDS")] = None,
    timeout: Annotated[Optional[float], _option("timeout", "--timeout", panel=POLICY_PANEL, metavar="SECONDS")] = None,
    check_timeout: Annotated[Optional[float], _option("check_timeout", "--check-timeout", panel=POLICY_PANEL, metavar="SECONDS")] = None,
    fail_level: Annotated[Optional[str], _option("fail_level", "--fail-level", panel=POLICY_PANEL, metavar="LEVEL")] = None,
    silence: Annotated[Optional[list[str]], _option("silence", "--silence", panel=POLICY_PANEL, metavar="ID")] = None,
    fmt: Annotated[Optional[str], _option("format", "--format", "-f", panel=OUTPUT_PANEL, metavar="FORMAT")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report to this file instead of stdout.", rich_help_panel=OUTPUT_PANEL)] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also list every check with its status and time.", rich_help_panel=OUTPUT_PANEL)] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only errors and the summary line.", rich_help_panel=OUTPUT_PANEL)] = False,
    all_ranks: Annotated[bool, typer.Option("--all-ranks", help="Every rank prints its own report too (by default only rank 0 reports, for the whole world).", rich_help_panel=OUTPUT_PANEL)] = False,
    rank: Annotated[Optional[int], typer.Option("--rank", min=0, max=2**31 - 2, help="This process's rank, as RANK would set it (for worlds started by hand).", rich_help_panel=WORLD_PANEL)] = None,
    world_size: Annotated[Optional[int], typer.Option("--world-size", min=1, max=2**31 - 1, help="The number of ranks, as WORLD_SIZE would set it.", rich_help_panel=WORLD_PANEL)] = None,
    master_addr: Annotated[Optional[str], typer.Option("--master-addr", help="Rank 0's host, as MASTER_ADDR would set it.", rich_help_panel=WORLD_PANEL)] = None,
    master_port: Annotated[Optional[int], typer.Option("--master-port", min=1, max=65535, help="The rendezvous port on rank 0's host, as MASTER_PORT would set it.", rich_help_panel=WORLD_PANEL)] = None,
    # The deprecated torch.distributed.launch appends --local-rank=N (--local_rank before 2.0);
    # accepted so that the launch checks, which read argv, can report that launcher.
    local_rank: Annotated[Optional[str], typer.Option("--local-rank", "--local_rank", hidden=True)] = None,
    launch_line: Annotated[Optional[list[str]], typer.Argument(help="After --, a launch line to check before it runs: torchrun ..., srun ..., mpirun ...", show_default=False)] = None,
) -> None:
    """Diagnose this node (and, with a launcher or --nproc, the whole world).

    Exit codes: 0 nothing at or above --fail-level; 1 findings at or above it; 2 usage error;
    3 the diagnosis was cut off by its deadline (partial report); 130 interrupted by SIGINT,
    143 by SIGTERM (partial report, or one line naming the stage).
    """
    config = load_check_config({
        "stages": stage, "tags": tag, "checks_dirs": [str(p) for p in checks_dir] if checks_dir else None,
        "backend": backend, "nproc": nproc, "timeout": timeout, "check_timeout": check_timeout,
        "fail_level": fail_level, "silence": silence, "format": fmt, "init_method": init_method,
        "pg_timeout": pg_timeout,
    })
    # Each command loads only its own logic, so that start-up (and --help) stays light.
    from distdoctor.core.registry import RegistryError
    from distdoctor.dispatch import check_entry
    from distdoctor.machine.launch_line import LaunchLineError
    from distdoctor.machine.launchers import NONE, detect

    started = command_started()
    env = by_hand_env(rank=rank, world_size=world_size, master_addr=master_addr, master_port=master_port)
    if nproc is not None and detect(env, sys.argv).launcher != NONE:
        fail_usage("--nproc starts a self-test world on this node; under a launcher every process is already one rank")
    PROGRESS.start(started, config.timeout)
    live = LiveStatus(live_wanted(config.format, quiet)).start()
    render = live.wrap(functools.partial(render_report, fmt=config.format, output=output, verbose=verbose, quiet=quiet))
    try:
        if config.tags:  # a mistyped --tag selects nothing: a usage error, before any world starts
            from distdoctor.core.engine import load_registry, select_checks

            select_checks(config, load_registry(config))
        code = check_entry(config, render, env=env, argv=sys.argv, all_ranks=all_ranks, started=started,
                           launch_line=launch_line or (), live=live)
    except (RegistryError, LaunchLineError) as exc:
        live.stop()
        fail_usage(str(exc))
    finally:
        live.stop()
    raise typer.Exit(code)


def say_interrupted(signum: int) -> None:
    """No report can be built here (distdoctor was starting, or ran the local stage on its own):
    one line on stderr names where it was; the exit code is 128 + the signal's number."""
    stop_live()
    sys.stderr.write(f"distdoctor: interrupted by {signal_name(signum)} in {where_now()}, "
                     f"{time.monotonic() - STARTED:.1f}s after it started; no report was written\n")


@app.command()
def bench(
    nproc: Annotated[Optional[int], typer.Option("--nproc", help=_help("nproc"), rich_help_panel=RUN_PANEL)] = None,
    backend: Annotated[Optional[str], typer.Option("--backend", help="gloo or nccl (default: nccl when every rank has its GPU, else gloo).", rich_help_panel=RUN_PANEL)] = None,
    sizes: Annotated[Optional[str], typer.Option("--sizes", help="Message sizes: a list (8,64K,16M) or FROM:TO[:FACTOR] (default 8:256M:2 on GPUs, 8:32M:4 on CPUs).", rich_help_panel=RUN_PANEL)] = None,
    ops: Annotated[Optional[str], typer.Option("--ops", help="Collectives to sweep (default: all_reduce,all_gather,reduce_scatter,broadcast,all_to_all).", rich_help_panel=RUN_PANEL)] = None,
    iters: Annotated[int, typer.Option("--iters", min=1, help="Timed iterations per size (fewer where one size would take over 0.5 s).", rich_help_panel=RUN_PANEL)] = 20,
    warmup: Annotated[int, typer.Option("--warmup", min=1, help="Untimed warm-up iterations per size.", rich_help_panel=RUN_PANEL)] = 5,
    links: Annotated[bool, typer.Option("--links/--no-links", help="Measure the link matrix (every rank pair, O(n) rounds).", rich_help_panel=RUN_PANEL)] = True,
    link_bytes: Annotated[Optional[str], typer.Option("--link-bytes", help="Message size of the link matrix's bandwidth test (default 1M on CPUs, 4M on GPUs).", rich_help_panel=RUN_PANEL)] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1.0, help="The whole run's deadline in seconds; past it the report is partial (exit 3).", rich_help_panel=POLICY_PANEL)] = 120.0,
    compare: Annotated[Optional[Path], typer.Option("--compare", help="A saved `bench --format json` report: figures worse by more than --tolerance are errors (exit 1).", rich_help_panel=POLICY_PANEL)] = None,
    tolerance: Annotated[float, typer.Option("--tolerance", min=0.0, max=0.99, help="Allowed loss against --compare, as a fraction (0.2 = 20 %).", rich_help_panel=POLICY_PANEL)] = 0.2,
    fmt: Annotated[str, typer.Option("--format", "-f", help="rich, json, markdown or html (the link matrix as a heatmap).", rich_help_panel=OUTPUT_PANEL)] = "rich",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report to this file instead of stdout.", rich_help_panel=OUTPUT_PANEL)] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every detail line.", rich_help_panel=OUTPUT_PANEL)] = False,
    rank: Annotated[Optional[int], typer.Option("--rank", help="This process's rank, as RANK would set it (for worlds started by hand).", rich_help_panel=WORLD_PANEL)] = None,
    world_size: Annotated[Optional[int], typer.Option("--world-size", help="The number of ranks, as WORLD_SIZE would set it.", rich_help_panel=WORLD_PANEL)] = None,
    master_addr: Annotated[Optional[str], typer.Option("--master-addr", help="Rank 0's host, as MASTER_ADDR would set it.", rich_help_panel=WORLD_PANEL)] = None,
    master_port: Annotated[Optional[int], typer.Option("--master-port", help="The rendezvous port on rank 0's host, as MASTER_PORT would set it.", rich_help_panel=WORLD_PANEL)] = None,
    local_rank: Annotated[Optional[str], typer.Option("--local-rank", "--local_rank", hidden=True)] = None,
) -> None:
    """Measure collective bandwidth (nccl-tests' algbw/busbw) and every link, and name the slow ones.

    Runs under the same launchers as `check` (or --nproc N ranks on this node). Exit codes:
    0 no errors; 1 errors (a wrong result, a regression against --compare); 2 usage error;
    3 cut off by --timeout (partial report).
    """

    from distdoctor.bench.compare import BaselineError, load_baseline  # loaded only when this path runs
    from distdoctor.bench.entry import BenchUsageError, bench_entry  # loaded only when this path runs
    from distdoctor.bench.settings import BACKENDS, BenchSettings  # loaded only when this path runs
    from distdoctor.bench.sizes import OPS, SizeError, parse_ops, parse_size, parse_sizes  # loaded only when this path runs
    started = command_started()  # the deadline counts from distdoctor's own start, as check's does
    if fmt not in ("rich", "json", "markdown", "html"):
        fail_usage(f"--format: expected rich, json, markdown or html, got {fmt!r}")
    if backend is not None and backend not in BACKENDS:
        fail_usage(f"--backend: expected {' or '.join(BACKENDS)}, got {backend!r}")
    if nproc is not None and nproc < 1:
        fail_usage("--nproc must be at least 1")
    try:
        settings = BenchSettings(
            ops=parse_ops(ops) if ops else OPS, sizes=parse_sizes(sizes) if sizes else None, iters=iters,
            warmup=warmup, timeout=timeout, backend=backend, links=links,
            link_bytes=parse_size(link_bytes) if link_bytes else None, nproc=nproc,
            baseline=load_baseline(compare) if compare else None, tolerance=tolerance, progress=True,
        )
    except (SizeError, BaselineError) as exc:
        fail_usage(str(exc))
    by_hand = {"RANK": rank, "WORLD_SIZE": world_size, "MASTER_ADDR": master_addr, "MASTER_PORT": master_port}
    env = {**os.environ, **{k: str(v) for k, v in by_hand.items() if v is not None}}
    render = functools.partial(render_bench_report, fmt=fmt, output=output, verbose=verbose)
    try:
        code = bench_entry(settings, render, env=env, argv=sys.argv, started=started)
    except BenchUsageError as exc:
        fail_usage(str(exc))
    raise typer.Exit(code)


@app.command("list")
def list_checks(
    checks_dir: Annotated[Optional[list[Path]], typer.Option("--checks-dir", help=_help("checks_dirs"))] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="rich or json.")] = "rich",
) -> None:
    """List every check and every finding ID with its cause and title."""
    from distdoctor.core.config import Config  # each command loads only its own logic: start-up stays light
    from distdoctor.dispatch import load_every_kind  # each command loads only its own logic: start-up stays light
    from distdoctor.core.registry import RegistryError  # each command loads only its own logic: start-up stays light

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
    from distdoctor.core.render import make_console  # each command loads only its own logic: start-up stays light

    console = make_console()
    check_rows = [(c["name"], c["stage"], ",".join(c["tags"]), ", ".join(c["emits"])) for c in checks]
    kind_rows = [(k["id"], k["severity"], k["cause"], k["title"]) for k in kinds]
    if console.is_terminal:
        print_table(console, "Checks", ("check", "stage", "tags", "emits"), check_rows)
        print_table(console, "Finding IDs", ("ID", "severity", "cause", "title"), kind_rows)
    else:
        # Piped: plain columns, every value whole (grep and cut see full IDs and check names).
        emit("\n".join(["Checks", *plain_columns(("check", "stage", "tags", "emits"), check_rows), "",
                         "Finding IDs", *plain_columns(("ID", "severity", "cause", "title"), kind_rows)]), None)
    for problem in registry.load_problems:
        console.print(f"[red]{problem.title}[/red]: {problem.detail}")


@app.command()
def show(
    name: Annotated[str, typer.Argument(help="A finding ID (e.g. launch.C001) or a check name (e.g. network.rendezvous_port).",
                                        metavar="ID_OR_CHECK")],
) -> None:
    """Show the documentation of a finding ID, or of a check and the findings it can report."""
    from distdoctor.core.config import Config  # each command loads only its own logic: start-up stays light
    from distdoctor.core.docs import finding_doc, finding_sections  # each command loads only its own logic: start-up stays light
    from distdoctor.dispatch import load_every_kind  # each command loads only its own logic: start-up stays light

    registry = load_every_kind(Config())
    check = registry.checks.get(name)
    if check is not None:
        show_markdown(check_markdown(check, finding_doc))
        return
    kind = registry.kinds.get(name)
    doc = finding_doc(name)
    if kind is None and doc is None:
        known = sorted(set(registry.kinds) | set(finding_sections()) | set(registry.checks))
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else " (distdoctor list shows them all)"
        fail_usage(f"unknown finding ID or check name {name!r}{hint}")
    lines = []
    if kind is not None:
        lines += [f"**{kind.id}** · {kind.severity.label} · cause `{kind.cause}`", "", kind.title, "",
                  f"hint: {kind.hint}", ""]
    lines.append(doc if doc else "(no documentation page found for this ID in this installation)")
    show_markdown("\n".join(lines))


@app.command()
def env(
    fmt: Annotated[str, typer.Option("--format", "-f", help="rich or json.")] = "rich",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the snapshot to this file.")] = None,
) -> None:
    """Print a snapshot of this process's distributed set-up for bug reports (secrets redacted)."""
    from distdoctor.machine.host import build_context  # each command loads only its own logic: start-up stays light
    from distdoctor.machine.snapshot import collect_snapshot  # each command loads only its own logic: start-up stays light

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
    files: Annotated[list[str], typer.Argument(help="Log files (one log, or one per rank), directories of them (torchrun --log-dir, flight-recorder dumps, error files), or - to read stdin.", show_default=False)],
    fmt: Annotated[Optional[str], _option("format", "--format", "-f", panel=OUTPUT_PANEL, metavar="FORMAT")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report to this file instead of stdout.", rich_help_panel=OUTPUT_PANEL)] = None,
    fail_level: Annotated[Optional[str], _option("fail_level", "--fail-level", panel=POLICY_PANEL, metavar="LEVEL")] = None,
    silence: Annotated[Optional[list[str]], _option("silence", "--silence", panel=POLICY_PANEL, metavar="ID")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every detail line and the files read.", rich_help_panel=OUTPUT_PANEL)] = False,
) -> None:
    """Name the cause of a failed job from its logs (torchrun output, per-rank logs, NCCL/Gloo errors).

    The logs are read as one job, split by rank: the first rank to fail is the cause, its
    peers' errors are its consequences. Each finding carries a confidence; a text with several
    possible causes lists them as candidates and says what to run to tell them apart. Exit
    codes: 0 nothing at or above --fail-level; 1 a cause was found at or above it; 2 unreadable
    input or usage error.
    """
    try:
        config = load_config({"format": fmt, "fail_level": fail_level, "silence": silence}, cli_flags=CLI_FLAGS)
    except ConfigError as exc:
        fail_usage(str(exc))
    from distdoctor.explain import LogInputError, explain_files  # each command loads only its own logic: start-up stays light

    try:
        report = explain_files(files, silence=config.silence)
    except LogInputError as exc:
        fail_usage(str(exc))
    if config.format == "html":
        add_guard_timeline(report, files)
    render_report(report, config.format, output, verbose=verbose, quiet=False)
    raise typer.Exit(report.exit_code(config.fail_level))


def add_guard_timeline(report: Any, inputs: list[str]) -> None:
    """A guard's --report-dir among explain's inputs: the page draws its run too (the stall timeline)."""
    dirs = [Path(i) for i in inputs if i != "-" and ((Path(i) / "stalls.json").is_file()
                                                     or (Path(i) / "slow_ranks.json").is_file())]
    if not dirs:
        return
    from distdoctor.timeline.job_report import job_report  # loaded only when a page of a guarded run is asked for
    from distdoctor.timeline.material import read_material

    report.data = {**(report.data or {}), "timeline": job_report(read_material(dirs)).data["timeline"]}


@app.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
def guard(
    command: Annotated[list[str], typer.Argument(help="The launcher line, after --: torchrun ... train.py, python train.py, srun ...", show_default=False)],
    hang_timeout: Annotated[Optional[float], typer.Option("--hang-timeout", help="Seconds a collective (DDP's and FSDP's too) may stay incomplete before the stall is diagnosed and reported (default 120; DISTDOCTOR_HANG_TIMEOUT).")] = None,
    report_dir: Annotated[Optional[Path], typer.Option("--report-dir", help="Write stalls.json (every stall of the run), the guard's JSON reports, each rank's snapshot and flight-recorder dump here, and after a run with a stall the run drawn: trace.json (Perfetto UI) and report.html (DISTDOCTOR_REPORT_DIR).")] = None,
    verify: Annotated[Optional[str], typer.Option("--verify", help="sample (default: the first 8 collectives of each group, then samples costing at most 1 % of the time), all, or off.")] = None,
    on_hang: Annotated[Optional[str], typer.Option("--on-hang", help="auto (default: end the job only when it cannot finish; a live rank outside the collective is reported and watched until the process group's own timeout), exit (end the job at the first verdict) or report (never end it). DISTDOCTOR_GUARD_ON_HANG.")] = None,
    slow: Annotated[Optional[str], typer.Option("--slow", help="on or off (default): the slow-rank accounting, which names the rank every step waits for, its cost, its line and why (docs/slow-ranks.md). DISTDOCTOR_GUARD_SLOW.")] = None,
    slow_window: Annotated[Optional[float], typer.Option("--slow-window", help="Seconds per window of the slow-rank accounting (default 30; DISTDOCTOR_GUARD_SLOW_WINDOW).")] = None,
) -> None:
    """Run a launcher line with the runtime guard on in every worker, the script unmodified.

    distdoctor guard -- torchrun --nproc-per-node 2 train.py. The script's collectives are
    verified across ranks before they run; every stall past the hang timeout (DDP's and FSDP's
    collectives included) is named (rank, cause, line) and followed until it clears; an exception
    or a rank that leaves early is named on every rank. The job is ended only when it cannot
    finish (--on-hang). The exit code is the command's. See docs/guard.md.
    """

    from distdoctor.embedded.guard.launch import guard_environment  # the embedded modules import torch; loaded only on this path

    try:
        env = guard_environment(os.environ, hang_timeout=hang_timeout, verify=verify, on_hang=on_hang,
                                report_dir=str(report_dir) if report_dir is not None else None,
                                slow=slow, slow_window=slow_window)
    except ValueError as exc:
        fail_usage(str(exc))
    program = shutil.which(command[0], path=env.get("PATH"))
    if program is None:
        fail_usage(f"command not found: {command[0]}")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # exec: the launcher takes this process's place, so signals and the exit code are its own.
        os.execve(program, command, env)
    except OSError as exc:
        fail_usage(f"cannot run {command[0]}: {exc.strerror or exc}")


@app.command()
def trace(
    inputs: Annotated[list[Path], typer.Argument(help="A guard's --report-dir (one per host, if each host wrote its own), or flight-recorder dumps (files or folders: torch's TORCH_FR_DUMP_TEMP_FILE <prefix><rank>, pickle or JSON).", show_default=False, metavar="DIR_OR_DUMP...")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Where to write the trace (default: DIR/trace.json for one directory, else ./trace.json).", rich_help_panel=OUTPUT_PANEL)] = None,
    html: Annotated[Optional[Path], typer.Option("--html", metavar="FILE", help="Also write the HTML report of the run (the stall timeline, the straggler profile, the guard's findings) here.", rich_help_panel=OUTPUT_PANEL)] = None,
) -> None:
    """Draw a guarded run as a timeline: trace.json for Perfetto UI (ui.perfetto.dev, "Open trace file").

    One process per rank, its collectives from the flight recorder, its stalls (the late rank's line
    and verdict; the waiting ranks linked to it), and its faults. The guard writes the same file
    (and report.html) in its --report-dir at the end of a run with a stall. Exit codes: 0 written;
    2 unreadable input, no evidence in it, or an unwritable output. See docs/report.md.
    """
    from distdoctor.timeline.material import InputError, read_material  # each command loads only its own logic
    from distdoctor.timeline.trace import build_trace  # each command loads only its own logic

    try:
        material = read_material(list(inputs))
    except InputError as exc:
        fail_usage(str(exc))
    if not material.ranks and not material.entries and not material.stalls:
        fail_usage(f"no evidence to draw in {', '.join(map(str, inputs))}: neither stalls.json, rank snapshots nor "
                   "flight-recorder dumps (was the guard run with --report-dir?)")
    target = output if output is not None else (inputs[0] / "trace.json" if len(inputs) == 1 and inputs[0].is_dir()
                                                 else Path("trace.json"))
    document = build_trace(material)
    emit(json.dumps(document, separators=(",", ":")), target)
    if html is not None:
        from distdoctor.timeline.html_run import run_page  # loaded only when a page is asked for
        from distdoctor.timeline.job_report import job_report

        emit(run_page(job_report(material), title="distdoctor: the run"), html)
    facts = document["otherData"]
    typer.echo(f"{target}: {facts['ranks']} rank{'s' if facts['ranks'] != 1 else ''}, {facts['stalls']} stall"
               f"{'s' if facts['stalls'] != 1 else ''}, {facts['collectives']} collectives"
               + (f"; {html} written" if html is not None else "")
               + "; open it in ui.perfetto.dev (Open trace file)")
    for lack in material.lacks:
        typer.echo(f"  lacks: {lack}")


STACKS_PANEL = "What to look at"
WATCH_PANEL = "Watching"


@app.command()
def stacks(
    pids: Annotated[Optional[list[int]], typer.Argument(help="PIDs of ranks, or of their launcher (torchrun, srun, mpirun); none: every torch.distributed job on this node.", show_default=False)] = None,
    native: Annotated[bool, typer.Option("--native", help="Also read C/C++ frames (py-spy --native; pauses each thread for the milliseconds of the dump, sends no signal).", rich_help_panel=STACKS_PANEL)] = False,
    slurm_job: Annotated[Optional[str], typer.Option("--slurm-job", metavar="JOBID", help="Look at every node of this SLURM job (srun --overlap) and merge one report.", rich_help_panel=STACKS_PANEL)] = None,
    slurm_node: Annotated[Optional[str], typer.Option("--slurm-node", hidden=True, help="One node's part of --slurm-job: only that job's ranks.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds the reads may take in all: each rank is read several times, in parallel, until the reads decide (with --watch: one read of one rank).", rich_help_panel=STACKS_PANEL)] = 10.0,
    span: Annotated[float, typer.Option("--span", metavar="SECONDS", help="How long a rank's reads must cover (at least 3 of them) before it counts as still: a stall or a hang is named only from what stayed still that long.", rich_help_panel=STACKS_PANEL)] = 1.0,
    watch: Annotated[bool, typer.Option("--watch", help="A live view: one row per rank (state, CPU %, line), the verdict as it forms and clears; Ctrl-C ends it with the report.", rich_help_panel=WATCH_PANEL)] = False,
    interval: Annotated[float, typer.Option("--interval", metavar="SECONDS", help="With --watch: seconds between two refreshes (and two reads of a rank).", rich_help_panel=WATCH_PANEL)] = 2.0,
    fmt: Annotated[Optional[str], _option("format", "--format", "-f", panel=OUTPUT_PANEL, metavar="FORMAT")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report to this file instead of stdout.", rich_help_panel=OUTPUT_PANEL)] = None,
    fail_level: Annotated[Optional[str], _option("fail_level", "--fail-level", panel=POLICY_PANEL, metavar="LEVEL")] = None,
    silence: Annotated[Optional[list[str]], _option("silence", "--silence", panel=POLICY_PANEL, metavar="ID")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every detail line and every rank read.", rich_help_panel=OUTPUT_PANEL)] = False,
) -> None:
    """Read every rank's stack of a running job with py-spy, several times, and tell a busy job from a hung one.

    Read-only: no signal is sent and nothing is written into the job, which keeps running.
    Finds the job's ranks from their environment (RANK, TORCHELASTIC_*, SLURM_PROCID ...) and
    launchers, reads each rank at least 3 times over --span, and names the rank that is late (and
    its line), the ranks that ended, or the collective every rank stays in; a job whose every rank
    moved is "running". --watch shows the job live. Exit codes: 0 nothing at or above
    --fail-level; 1 findings at or above it; 2 usage error. See docs/stacks.md.
    """
    try:
        config = load_config({"format": fmt, "fail_level": fail_level, "silence": silence}, cli_flags=CLI_FLAGS)
    except ConfigError as exc:
        fail_usage(str(exc))
    check_stacks_options(timeout, span, interval, watch=watch, slurm_job=slurm_job, pids=pids, slurm_node=slurm_node)
    from distdoctor.stacks import look, look_slurm_job  # each command loads only its own logic: start-up stays light

    job_filter = {"SLURM_JOB_ID": slurm_node} if slurm_node else None
    if watch:
        raise typer.Exit(watch_stacks(pids or (), started=command_started(), native=native, interval=interval, timeout=timeout, span=span,
                                       job_filter=job_filter, config=config, output=output, verbose=verbose))
    PROGRESS.start(command_started(), timeout)
    PROGRESS.set_stage("reading every rank's stack")
    with LiveStatus(live_wanted(config.format, False)):
        if slurm_job:
            report = look_slurm_job(slurm_job, native=native, timeout_s=timeout, span_s=span, silence=config.silence)
        else:
            report = look(pids or (), native=native, timeout_s=timeout, span_s=span, silence=config.silence,
                          job_filter=job_filter)
    render_report(report, config.format, output, verbose=verbose, quiet=False)
    raise typer.Exit(report.exit_code(config.fail_level))


LINT_FORMATS = ("rich", "json", "markdown", "sarif")


@app.command()
def lint(
    paths: Annotated[list[str], typer.Argument(help="Python files or directories (searched recursively), or - to read stdin.", show_default=False)],
    fmt: Annotated[str, typer.Option("--format", "-f", help="Report format: rich, json, markdown or sarif (SARIF 2.1.0, for GitHub code scanning).", rich_help_panel=OUTPUT_PANEL)] = "rich",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report to this file instead of stdout.", rich_help_panel=OUTPUT_PANEL)] = None,
    select: Annotated[Optional[list[str]], typer.Option("--select", help="Only these rule IDs (comma lists; globs like lint.W* or prefixes like lint.E).", rich_help_panel=POLICY_PANEL)] = None,
    ignore: Annotated[Optional[list[str]], typer.Option("--ignore", help="Skip these rule IDs (comma lists; globs or prefixes).", rich_help_panel=POLICY_PANEL)] = None,
    exclude: Annotated[Optional[list[str]], typer.Option("--exclude", help="Skip files and directories matching these globs when walking a directory.", rich_help_panel=POLICY_PANEL)] = None,
    fail_level: Annotated[Optional[str], typer.Option("--fail-level", help=_help("fail_level"), rich_help_panel=POLICY_PANEL)] = None,
    stdin_filename: Annotated[str, typer.Option("--stdin-filename", help="The name to report for source read from stdin.", rich_help_panel=OUTPUT_PANEL)] = "<stdin>",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also list every rule with its finding count.", rich_help_panel=OUTPUT_PANEL)] = False,
) -> None:
    """Find distributed-training mistakes in the source, without running it (ast only).

    Settings also come from [tool.distdoctor.lint] (select, ignore, exclude, fail-level); a
    `# distdoctor: ignore[lint.W003]` comment silences a rule on its line. Exit codes: 0 nothing
    at or above --fail-level; 1 findings at or above it; 2 usage error (missing path, bad option).
    """
    if fmt not in LINT_FORMATS:
        fail_usage(f"--format: expected one of {', '.join(LINT_FORMATS)}, got {fmt!r}")
    from distdoctor.lint import LintInputError, LintSettingsError, all_ids, lint_paths, load_settings  # loaded only when linting is asked for

    try:
        settings = load_settings(all_ids(), cli={"select": select, "ignore": ignore, "exclude": exclude, "fail_level": fail_level})
        report = lint_paths(paths, settings, stdin_name=stdin_filename)
    except (LintInputError, LintSettingsError) as exc:
        fail_usage(str(exc))
    if fmt == "sarif":
        from distdoctor.lint.sarif import render_sarif  # loaded only when linting is asked for
        from distdoctor.core.registry import REGISTRY  # each command loads only its own logic: start-up stays light

        kinds = [REGISTRY.kinds[i] for i in all_ids() if settings.wants(i)]
        emit(render_sarif(report, kinds, version=__version__), output)
    else:
        render_report(report, fmt, output, verbose=verbose, quiet=False)
    raise typer.Exit(report.exit_code(settings.fail_level))


def run() -> None:
    """Console-script entry point: usage errors exit 2, never a traceback; SIGINT/SIGTERM end the
    process with 130/143 after a last word (see distdoctor.core.interrupt)."""
    install_watcher(default=say_interrupted)
    _first_command[0] = True
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("distdoctor: interrupted", err=True)
        sys.exit(130)
