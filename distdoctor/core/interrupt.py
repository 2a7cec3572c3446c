"""SIGINT and SIGTERM turned into a last word and a documented exit code (130, 143).

A Python signal handler runs only when the main thread returns to the interpreter, which a
rank stuck in a C++ wait (a store read, a gloo collective) never does. So the handler installed
here only passes the signal on: ``signal.set_wakeup_fd`` makes the C-level handler write the signal's
number to a pipe at once, and a thread reading that pipe calls ``on_signal`` (which prints the
partial report, or one line naming the stage) and ends the process with 128 + the signal number.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_SIGINT, EXIT_SIGTERM = 128 + signal.SIGINT, 128 + signal.SIGTERM


def exit_code_for(signum: int) -> int:
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


_handler_lock = threading.Lock()
_handler: Callable[[int], None] | None = None


def set_interrupt_handler(handler: Callable[[int], None] | None) -> Callable[[int], None] | None:
    """What the process's watcher does on a signal from now on (the part of the run that knows
    the most registers itself); returns the previous handler."""
    global _handler
    with _handler_lock:
        previous, _handler = _handler, handler
    return previous


def current_handler() -> Callable[[int], None] | None:
    with _handler_lock:
        return _handler


_default: Callable[[int], None] | None = None
_installed_in: int | None = None


def install_watcher(default: Callable[[int], None] | None = None) -> None:
    """Watch SIGINT/SIGTERM in this process (once per process: a forked child watches anew); on
    one, run the registered handler, else ``default`` (the latest given), then exit 128 + signum.

    Main thread only, and only in distdoctor's own process (the CLI's entry points): it replaces
    the process's SIGINT/SIGTERM handling.
    """
    global _default, _installed_in
    if default is not None:
        _default = default
    if _installed_in == os.getpid():
        return

    def on_signal(signum: int) -> None:
        handler = current_handler() or _default
        if handler is not None:
            handler(signum)

    SignalWatcher(on_signal).install()
    _installed_in = os.getpid()


class SignalWatcher:
    """Watches SIGINT/SIGTERM from a thread; ``on_signal(signum)`` runs once, then the exit."""

    def __init__(self, on_signal: Callable[[int], None], *, exit: Callable[[int], None] = os._exit) -> None:
        self.on_signal = on_signal
        self._exit = exit
        self._once = threading.Lock()
        self._read_fd: int | None = None

    def install(self) -> "SignalWatcher":
        """Main thread only. Replaces this process's SIGINT/SIGTERM handling (a forked child
        calls it again: the pipe it inherited belongs to its parent)."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        def tell_the_watcher(signum: int, frame: object) -> None:
            # A signal that arrived before set_wakeup_fd took effect reaches only this Python-level
            # handler: pass it on (the watcher acts once, however often it is told).
            try:
                os.write(write_fd, bytes([signum]))
            except OSError:
                pass

        for signum in SIGNALS:
            signal.signal(signum, tell_the_watcher)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._read_fd = read_fd
        threading.Thread(target=self._watch, name="distdoctor-signals", daemon=True).start()
        return self

    def _watch(self) -> None:
        assert self._read_fd is not None
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except InterruptedError:
                continue
            except OSError:
                return
            for signum in data:
                if signum in SIGNALS:
                    self._fire(signum)

    def _fire(self, signum: int) -> None:
        if not self._once.acquire(blocking=False):
            return
        # However on_signal ends, the process ends with the code for this signal.
        backstop = threading.Timer(5.0, lambda: self._end(signum))
        backstop.daemon = True
        backstop.start()
        try:
            self.on_signal(signum)
        except BaseException as exc:
            try:
                sys.stderr.write(f"distdoctor: interrupted by {signal_name(signum)} ({exc})\n")
            except Exception:
                pass
        self._end(signum)

    def _end(self, signum: int) -> None:
        _flush()
        end_children()
        self._exit(exit_code_for(signum))


def end_children() -> None:
    """SIGKILL, by PID, the processes this one started and that are still alive (a site check
    running in a forked child, say): none outlives an interrupted run."""
    try:
        import psutil  # only when a signal came: not on every run's start-up path

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    except Exception:
        pass  # the exit must happen whatever this could not do

