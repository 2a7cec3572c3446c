"""`distdoctor stacks`' options checked, and its --watch loop: a refresh every interval, then the report."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

from distdoctor.cli.options import fail_usage
from distdoctor.cli.output import render_report


def check_stacks_options(timeout: float, span: float, interval: float, *, watch: bool, slurm_job: Optional[str],
                          pids: Optional[list[int]], slurm_node: Optional[str]) -> None:
    if not 0.5 <= timeout <= 600:
        fail_usage(f"--timeout: {timeout:g}s is out of range (0.5 to 600 seconds)")
    if not 0.2 <= span <= 3600 or (not watch and span >= timeout):
        fail_usage(f"--span: {span:g}s is out of range (0.2 s up to 3600 s, and less than --timeout {timeout:g}s, "
                   "which bounds the reads)")
    if not 0.2 <= interval <= 3600:
        fail_usage(f"--interval: {interval:g}s is out of range: a rank is read at most every 0.2 s (a read is a "
                   "py-spy dump) and at least once an hour")
    if slurm_job and (pids or slurm_node):
        fail_usage("--slurm-job looks at every node of the job: give no PIDs with it")
    if watch and slurm_job:
        fail_usage("--watch looks at this node's ranks: run it on each node (or drop --watch: --slurm-job reads every node once)")


def watch_stacks(pids: Any, *, started: float, native: bool, interval: float, timeout: float, span: float, job_filter: Any,
                  config: Any, output: Optional[Path], verbose: bool) -> int:
    """The --watch loop: a refresh every interval until Ctrl-C, SIGTERM or SIGHUP, then the report."""
    import signal
    import threading

    from distdoctor.core.interrupt import set_interrupt_handler
    from distdoctor.stacks.watch import Watch

    watcher = Watch(pids, native=native, interval_s=interval, timeout_s=timeout, span_s=span, job_filter=job_filter)
    stop, done, code = threading.Event(), threading.Event(), [0]

    def on_signal(signum: int) -> None:  # the signal watcher's thread: the main thread writes the report
        stop.set()
        done.wait(4.0)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code[0])

    set_interrupt_handler(on_signal)
    signal.signal(signal.SIGHUP, lambda *_: stop.set())  # the terminal closed: end as on Ctrl-C
    view = sys.stdout if config.format == "rich" and output is None else sys.stderr
    try:
        _watch_loop(watcher, view, interval, stop)
    finally:
        watcher.close()
    report = watcher.report(started, silence=config.silence)
    code[0] = report.exit_code(config.fail_level)
    try:
        render_report(report, config.format, output, verbose=verbose, quiet=False)
    except OSError:
        pass  # the terminal or pipe is gone: nobody is left to read the report
    done.set()
    return code[0]


def _watch_loop(watcher: Any, view: Any, interval: float, stop: Any) -> None:
    from distdoctor.stacks import watch_view

    live, before = None, None
    try:
        if view.isatty():
            from rich.console import Console
            from rich.live import Live

            live = Live(console=Console(file=view), auto_refresh=False, redirect_stdout=False, redirect_stderr=False)
            live.start()
        while not stop.is_set():
            screen = watcher.poll(stop)
            if live is not None:
                live.update(watch_view.table(screen, interval_s=interval), refresh=True)
            else:
                for line in watch_view.changes(before, screen):
                    view.write(line + "\n")
                view.flush()
            before = screen
    except OSError:
        # The terminal closed or the reader of the pipe left: stop writing there for good.
        stop.set()
        _silence(view)
    finally:
        if live is not None:
            try:
                live.stop()
            except OSError:
                _silence(view)


def _silence(stream: Any) -> None:
    """Point a stream that can no longer be written (EPIPE, EIO) at /dev/null."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    except (OSError, ValueError):
        pass
