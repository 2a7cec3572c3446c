"""torch's flight recorder read from inside the job: every collective counted, whoever issued it."""

# DDP's bucket all-reduces, FSDP's all-gathers and reduce-scatters run in C++ and never pass
# through the Python functions the guard wraps, but c10d's FlightRecorder records every
# collective of every process group (gloo and NCCL alike) when its buffer is not 0.
# `_dump_fr_trace_json(includeCollectives=False)` returns only `pg_status` (last enqueued /
# completed sequence number per group, as text): about 0.04 ms, so the watchdog reads it on
# every poll. The full dump (entries with sizes and dtypes: about 30 ms for 2,000 entries on a
# 2-core machine) is read only when a rank is asked for its state. Gloo marks completion
# asynchronously (an entry stays "scheduled"; last_completed_collective catches up within about
# 0.5 s), so a group is stalled only when enqueued > completed has not moved for hang_timeout.

from __future__ import annotations

import json
import os
import pickle
import threading
import time
from typing import Any, Callable, Mapping

from distdoctor.diagnosis.flight_recorder import read_dump
from distdoctor.diagnosis.snapshot import GroupProgress

BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DEFAULT_BUFFER = 2000


def buffer_setting(env: Mapping[str, str]) -> tuple[str | None, int | None]:
    """(the variable the user set, its value as an int or None when it is not one)."""
    for name in BUFFER_VARS:
        raw = env.get(name)
        if raw is not None and raw.strip() != "":
            try:
                return name, int(raw.strip())
            except ValueError:
                return name, None
    return None, None


def launch_environment(env: dict[str, str]) -> str:
    """Set the recorder's buffer for a job the guard starts; returns a problem in words, or ""."""
    name, value = buffer_setting(env)
    if name is None:
        env["TORCH_FR_BUFFER_SIZE"] = str(DEFAULT_BUFFER)
        return ""
    if value is None:
        # torch 2.13 aborts in init_process_group on such a value ("terminate called without
        # an active exception"): the job could not start at all. The guard runs it with the
        # recorder off and says so.
        bad = env[name]
        env[name] = "0"
        return (f"{name}={bad!r} is not an integer (torch aborts on it in init_process_group); "
                f"the guard runs the job with {name}=0")
    return ""


def prepare_this_process() -> None:
    """Before this process's init_process_group (distdoctor.init_process_group(guard=True)):
    the recorder's buffer as `distdoctor guard --` sets it for its workers."""
    env = dict(os.environ)
    note = launch_environment(env)
    for name in BUFFER_VARS:
        if name in env and os.environ.get(name) != env[name]:
            os.environ[name] = env[name]
    if note:
        os.environ["DISTDOCTOR_GUARD_FR_NOTE"] = note


def _problem_from_env(env: Mapping[str, str]) -> str:
    name, value = buffer_setting(env)
    if name is not None and value is not None and value <= 0:
        return f"{name}={value} turns torch's flight recorder off"
    return ""


# A read that fails (torch's recorder busy or resetting, a dump torch could not build) is tried
# again: after RETRY_FIRST_S, then twice as late each time, at most RETRY_MOST_S apart. In between
# the recorder counts as unusable (the watchdog falls back to the main thread's look), and one
# good read brings it back.
RETRY_FIRST_S = 0.5
RETRY_MOST_S = 60.0


class FlightRecorder:
    """This process's recorder: its groups' progress, cheap status polls, the dump as evidence."""

    def __init__(self, c10d_module: Any, env: Mapping[str, str], launch_note: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._json = getattr(c10d_module, "_dump_fr_trace_json", None)
        self._pickle = getattr(c10d_module, "_dump_fr_trace", None)
        self.off = launch_note or _problem_from_env(env)   # off for the whole run: this torch, this setting
        if self._json is None and self._pickle is None and not self.off:
            self.off = "this torch has no flight recorder (torch._C._distributed_c10d._dump_fr_trace_json)"
        self.clock = clock
        self.failures = 0                                    # failed reads in a row
        self.failure = ""                                    # the last one, in words
        self.retry_at = 0.0                                  # clock(): no read before this after a failure
        # The gate every read passes: once closed (the rank's end), only the thread that closed it reads.
        # A thread inside torch's C++ code when the interpreter finalizes aborts the process as it comes
        # back, so no thread of the guard's may be in a read then; a read does no I/O, so closing waits
        # only for the one in progress.
        self._gate = threading.Lock()
        self._closed_by: int | None = None

    def close(self) -> None:
        """From now on only this thread reads the recorder (the others' reads answer None)."""
        with self._gate:
            self._closed_by = threading.get_ident()

    def _shut(self) -> bool:
        return self._closed_by is not None and self._closed_by != threading.get_ident()

    @property
    def problem(self) -> str:
        """Why the recorder cannot be read now ("" when it can)."""
        if self.off:
            return self.off
        if self.failures and self.clock() < self.retry_at:
            return (f"reading torch's flight recorder failed ({self.failures} time{'s' if self.failures > 1 else ''} "
                    f"in a row; tried again in {self.retry_at - self.clock():.1f} s): {self.failure}")
        return ""

    @property
    def usable(self) -> bool:
        return not self.problem

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        self.failure = f"{type(exc).__name__}: {str(exc)[:200]}"
        self.retry_at = self.clock() + min(RETRY_MOST_S, RETRY_FIRST_S * 2 ** (self.failures - 1))

    def _read(self, collectives: bool) -> dict[str, Any] | None:
        """One dump; a failure is counted (the next read waits) and gives None, never an exception."""
        try:
            with self._gate:
                if self._shut():
                    return None
                if self._json is not None:
                    raw: Any = self._json(includeCollectives=collectives, onlyActive=False)
                elif self._pickle is not None:
                    raw = self._pickle(includeCollectives=collectives, includeStackTraces=False)
                else:
                    return None
            # The process's own recorder, read back in the same process: no foreign input.
            dump = json.loads(raw) if self._json is not None else pickle.loads(raw)
        except Exception as exc:  # the recorder must never take the guard down
            self._failed(exc)
            return None
        self.failures, self.failure = 0, ""
        return dump

    def status(self) -> dict[str, tuple[int, int]]:
        """group -> (last enqueued, last completed); {} when the recorder cannot tell."""
        if not self.usable:
            return {}
        raw = (self._read(False) or {}).get("pg_status") or {}
        out = {}
        for group, state in raw.items() if isinstance(raw, Mapping) else ():
            if isinstance(state, Mapping):
                try:
                    out[str(group)] = (int(state.get("last_enqueued_collective", -1)),
                                       int(state.get("last_completed_collective", -1)))
                except (TypeError, ValueError):
                    continue
        return out

    def groups(self) -> tuple[GroupProgress, ...]:
        """Every group's progress with its pending op and recent entries (the full dump)."""
        if not self.usable:
            return ()
        dump = self._read(True)
        return (read_dump(dump, time.time_ns()) or ()) if dump is not None else ()

    def torch_dump(self) -> bytes | None:
        """The dump in torch's own pickle form (what torch's fr_trace analyzer reads)."""
        if not self.usable or self._pickle is None:
            return None
        try:
            with self._gate:
                if self._shut():
                    return None
                return bytes(self._pickle(includeCollectives=True, includeStackTraces=False, onlyActive=False))
        except Exception:  # evidence is best effort
            return None
