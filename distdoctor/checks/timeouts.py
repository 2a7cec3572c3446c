"""Timeouts and error handling: how long a fault hangs before anything notices, and what then.

torch 2.13 (torch/distributed/constants.py, ProcessGroupNCCL.hpp/.cpp, FlightRecorder.hpp):
  - default process-group timeout: 30 min (default_pg_timeout) for gloo/mpi/ucc, 10 min for nccl
    (default_pg_nccl_timeout); init_process_group(timeout=...) overrides it. torch has no
    environment variable for it, so the job's value is given to distdoctor as its pg_timeout
    setting (--pg-timeout, DISTDOCTOR_PG_TIMEOUT or pg-timeout in [tool.distdoctor], seconds).
  - TORCH_NCCL_ASYNC_ERROR_HANDLING (old name NCCL_ASYNC_ERROR_HANDLING): 0 no handling, 1 tear
    down the process, 2 clean up only, 3 (default) skip clean-up and tear down.
  - TORCH_NCCL_BLOCKING_WAIT (NCCL_BLOCKING_WAIT): wait() blocks and raises on timeout.
  - TORCH_NCCL_ENABLE_MONITORING (default on) and TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC (default
    480 s): a monitor thread kills the process when the watchdog itself is stuck.
  - flight recorder: TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE (default 2000 entries,
    0 disables), TORCH_NCCL_DUMP_ON_TIMEOUT (default on) writes it to TORCH_FR_DUMP_TEMP_FILE /
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE on a timeout.
Integers are read with std::stoi and booleans accept y/yes/t/true/1 and n/no/f/false/0; any other
value makes ProcessGroupNCCL's constructor fail with "Invalid value for environment variable".
"""

from __future__ import annotations

import sys
from typing import Any

from distdoctor.checks._support import remedies
from distdoctor.checks._support.c_integers import leading_int
from distdoctor.core.context import CheckContext
from distdoctor.core.registry import check, finding_kind
from distdoctor.machine import torch_facts

DEFAULT_TIMEOUT_S = {"nccl": 600.0}
DEFAULT_OTHER_TIMEOUT_S = 1800.0
TOO_LONG_S = 3600.0
TOO_SHORT_S = 60.0
HEARTBEAT_DEFAULT_S = 480
HEARTBEAT_TOO_SHORT_S = 60
FR_DEFAULT_ENTRIES = 2000

# (canonical name, older names), first wins like torch's getCvar*.
ASYNC_ERROR_HANDLING = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING")
BLOCKING_WAIT = ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")
ENABLE_MONITORING = ("TORCH_NCCL_ENABLE_MONITORING",)
HEARTBEAT = ("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",)
FR_BUFFER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMP_ON_TIMEOUT = ("TORCH_NCCL_DUMP_ON_TIMEOUT",)
_INT_VARS = (ASYNC_ERROR_HANDLING, HEARTBEAT, FR_BUFFER)
_BOOL_VARS = (BLOCKING_WAIT, ENABLE_MONITORING, DUMP_ON_TIMEOUT)
_TRUE = ("y", "yes", "t", "true", "1")
_FALSE = ("n", "no", "f", "false", "0")

FLIGHT_RECORDER_ON = (
    "TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_FR_DUMP_TEMP_FILE=/shared/fr/trace_rank_ "
    "(then analyse the dumps with `python -m torch.distributed.flight_recorder.fr_trace`)"
)

TIMEOUT_TOO_LONG = finding_kind(
    "timeouts.W001", cause="timeout_config",
    title="The process-group timeout is so long that a hang lasts hours",
    hint="Use a timeout of 10-30 minutes and turn the flight recorder on",
)
TIMEOUT_TOO_SHORT = finding_kind(
    "timeouts.W002", cause="timeout_config",
    title="The process-group timeout is so short that healthy jobs may abort",
    hint="Allow at least a few minutes: NCCL init, checkpoint loads and compilation are slow",
)
ERROR_HANDLING_OFF = finding_kind(
    "timeouts.W003", cause="timeout_config",
    title="NCCL error handling is off: a timed-out collective never ends the job",
    hint="Unset TORCH_NCCL_ASYNC_ERROR_HANDLING (default 3) or set TORCH_NCCL_BLOCKING_WAIT=1",
)
MONITORING_WEAK = finding_kind(
    "timeouts.W004", cause="timeout_config",
    title="The NCCL watchdog monitor is off or mis-set",
    hint="Keep TORCH_NCCL_ENABLE_MONITORING on and the heartbeat timeout at minutes, not hours or seconds",
)
FLIGHT_RECORDER_OFF = finding_kind(
    "timeouts.W005", cause="timeout_config",
    title="The NCCL flight recorder will not record what hung",
    hint="Leave TORCH_FR_BUFFER_SIZE at its default (2000) with TORCH_NCCL_DUMP_ON_TIMEOUT=1",
)
VALUE_UNREADABLE = finding_kind(
    "timeouts.E006", cause="timeout_config",
    title="A timeout or error-handling variable has a value torch rejects",
    hint="Use an integer (or 0/1) as torch expects",
)
# timeouts.W007 (DISTDOCTOR_PG_TIMEOUT unreadable) is retired: pg_timeout is now a config option
# and a bad value is a usage error that names its source, like every other setting.


def _first(ctx: CheckContext, names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        if name in ctx.env:
            return name, ctx.env[name]
    return None


def _stoi(text: str) -> int | None:
    """std::stoi: optional leading blanks, then leading_int."""
    return leading_int(text.lstrip())


def _int(ctx: CheckContext, names: tuple[str, ...]) -> int | None:
    found = _first(ctx, names)
    return _stoi(found[1]) if found else None


def _bool(ctx: CheckContext, names: tuple[str, ...]) -> bool | None:
    found = _first(ctx, names)
    if not found:
        return None
    value = found[1].lower()
    return True if value in _TRUE else False if value in _FALSE else None


def default_timeout_s(backend: str) -> float:
    """torch's own default for this backend, read from torch when it is already imported, or from
    the child that read torch's facts once it has answered; else the defaults of torch 2.x."""
    timeouts: Any = None
    if "torch.distributed.constants" in sys.modules:
        try:
            timeouts = torch_facts.read_default_timeouts()
        except Exception:
            pass
    elif (child := torch_facts.prefetched()) is not None:
        timeouts = (child.finished() or {}).get("timeouts")
    value = timeouts.get("nccl" if backend == "nccl" else "other") if isinstance(timeouts, dict) else None
    if isinstance(value, (int, float)):
        return float(value)
    return DEFAULT_TIMEOUT_S.get(backend, DEFAULT_OTHER_TIMEOUT_S)


def effective_timeout(ctx: CheckContext) -> tuple[float, str]:
    if ctx.config.pg_timeout is not None:
        return ctx.config.pg_timeout, f"pg_timeout={ctx.config.pg_timeout:g}s from {ctx.config.sources.get('pg_timeout', 'configuration')}"
    backend = ctx.backend
    return default_timeout_s(backend), f"torch's default for {backend}"


def _human(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


@check(stage="local", tags=("timeouts",), emits=(TIMEOUT_TOO_LONG, TIMEOUT_TOO_SHORT))
def process_group_timeout(ctx: CheckContext):
    """The collective timeout the job runs with: hours of hang, or aborts of healthy work."""
    timeout, source = effective_timeout(ctx)
    data = {"timeout_s": timeout, "source": source, "backend": ctx.backend}
    if timeout > TOO_LONG_S:
        yield TIMEOUT_TOO_LONG(
            f"Collective timeout is {_human(timeout)} ({source})",
            detail=f"A rank that dies or stalls leaves the others blocked in their next collective for {_human(timeout)} "
            "before anything is reported; the job burns its allocation and the first error is lost in the noise.",
            remediation="init_process_group(..., timeout=datetime.timedelta(minutes=30)) (10 min for NCCL is torch's default); "
            "and record what hangs: " + remedies.set_env(ctx, "TORCH_FR_BUFFER_SIZE", "2000")
            + f" with {FLIGHT_RECORDER_ON}",
            data=data,
        )
    elif timeout < TOO_SHORT_S:
        yield TIMEOUT_TOO_SHORT(
            f"Collective timeout is {_human(timeout)} ({source})",
            detail="The first collectives wait for the slowest rank's start-up: NCCL communicator init on many nodes, "
            "checkpoint loading, torch.compile. A timeout under a minute aborts healthy jobs with "
            "\"Watchdog caught collective operation timeout\".",
            remediation="init_process_group(..., timeout=datetime.timedelta(minutes=10)) or longer; keep short timeouts for "
            "tests only (distdoctor's own checks use short deadlines without changing the job's)",
            data=data,
        )


@check(stage="local", tags=("timeouts", "nccl"), emits=(ERROR_HANDLING_OFF, MONITORING_WEAK, FLIGHT_RECORDER_OFF, VALUE_UNREADABLE))
def nccl_error_handling(ctx: CheckContext):
    """TORCH_NCCL_ASYNC_ERROR_HANDLING, BLOCKING_WAIT, monitoring/heartbeat and the flight recorder."""
    nccl = ctx.backend == "nccl"
    # Unparsable values break ProcessGroupNCCL's constructor whatever else is set.
    for names in _INT_VARS + _BOOL_VARS:
        found = _first(ctx, names)
        if not found:
            continue
        name, raw = found
        ok = _stoi(raw) is not None if names in _INT_VARS else raw.lower() in _TRUE + _FALSE
        if not ok and nccl:
            expected = "an integer" if names in _INT_VARS else "one of 0/1, true/false, yes/no"
            yield VALUE_UNREADABLE(
                f"{name}={raw!r} is not {expected}",
                detail=f"torch reads {name} when it creates the NCCL process group and raises \"Invalid value for "
                f"environment variable: {name}\": init_process_group fails on every rank.",
                remediation=remedies.unset_env(ctx, name) + f", or set it to {expected}",
                data={"variable": name, "value": raw},
            )
    if not nccl:
        return
    handling = _int(ctx, ASYNC_ERROR_HANDLING)
    blocking = _bool(ctx, BLOCKING_WAIT)
    if handling == 0 and not blocking:
        name = _first(ctx, ASYNC_ERROR_HANDLING)[0]
        yield ERROR_HANDLING_OFF(
            f"{name}=0 and TORCH_NCCL_BLOCKING_WAIT is not set",
            detail="The watchdog notices a timed-out or failed collective but nothing aborts the communicator or the "
            "process: the ranks hang until the job's wall-clock limit.",
            remediation=remedies.unset_env(ctx, name) + " (torch's default 3 tears the process down), "
            "or " + remedies.set_env(ctx, "TORCH_NCCL_BLOCKING_WAIT", "1"),
            data={"variable": name, "value": 0},
        )
    monitoring = _bool(ctx, ENABLE_MONITORING)
    heartbeat = _int(ctx, HEARTBEAT)
    if monitoring is False:
        yield MONITORING_WEAK(
            "TORCH_NCCL_ENABLE_MONITORING=0: a stuck NCCL watchdog is never detected",
            detail="When the watchdog itself hangs (a CUDA call blocked, a GIL deadlock) nothing kills the process; "
            f"by default the monitor aborts it after TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC ({HEARTBEAT_DEFAULT_S} s) and dumps the flight recorder.",
            remediation=remedies.unset_env(ctx, "TORCH_NCCL_ENABLE_MONITORING"),
            data={"monitoring": False},
        )
    elif heartbeat is not None and (heartbeat > TOO_LONG_S or heartbeat < HEARTBEAT_TOO_SHORT_S):
        long_ = heartbeat > TOO_LONG_S
        yield MONITORING_WEAK(
            f"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={heartbeat}: " + ("a stuck watchdog goes unnoticed for hours" if long_ else "healthy jobs may be killed"),
            detail=("The monitor waits this long before it kills a process whose watchdog is stuck."
                    if long_ else "A watchdog delayed by a long GIL hold or a slow CUDA call misses a short heartbeat and the monitor aborts the process."),
            remediation=remedies.set_env(ctx, "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", str(HEARTBEAT_DEFAULT_S)),
            data={"heartbeat_s": heartbeat},
        )
    buffer = _int(ctx, FR_BUFFER)
    dump = _bool(ctx, DUMP_ON_TIMEOUT)
    if buffer is not None and buffer <= 0:
        name = _first(ctx, FR_BUFFER)[0]
        yield FLIGHT_RECORDER_OFF(
            f"{name}={buffer}: the flight recorder is off"
            + (", so TORCH_NCCL_DUMP_ON_TIMEOUT has nothing to dump" if dump else ""),
            detail="After a timeout there is no record of which collective each rank was in, the one fact that "
            "names the stuck rank and the mismatched collective.",
            remediation=remedies.unset_env(ctx, name) + f" (default {FR_DEFAULT_ENTRIES} entries); to keep the dumps: {FLIGHT_RECORDER_ON}",
            data={"variable": name, "buffer": buffer, "dump_on_timeout": dump},
        )
    elif dump is False:
        yield FLIGHT_RECORDER_OFF(
            "TORCH_NCCL_DUMP_ON_TIMEOUT=0: the flight recorder is never written out",
            detail="The recorder runs, but nothing dumps it when a collective times out.",
            remediation=remedies.unset_env(ctx, "TORCH_NCCL_DUMP_ON_TIMEOUT") + f"; {FLIGHT_RECORDER_ON}",
            data={"dump_on_timeout": False},
        )
