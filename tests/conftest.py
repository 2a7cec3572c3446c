"""Suite-wide fixtures. Heavier, area-specific fixtures live in each test directory."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# `python -m distdoctor` with torch imported before distdoctor's clock starts. The process says on stderr how
# long the import took (a lab rank's deadline is judged from when distdoctor started: tests/hosts), and touches
# the file $READY_FILE names, when set, once it is past the import (a test that must start another rank only
# then: tests/multiproc).
IMPORTED = "lab: torch imported in "
DISTDOCTOR_AFTER_TORCH = [sys.executable, "-c", "import os, sys, time; began = time.monotonic(); import runpy, torch.distributed; "
                          f"print(f'{IMPORTED}{{time.monotonic() - began:.3f}} s', file=sys.stderr, flush=True); "
                          "ready = os.environ.get('READY_FILE'); ready and open(ready, 'a').close(); "
                          "runpy.run_module('distdoctor', run_name='__main__', alter_sys=True)"]


@pytest.fixture
def fresh_registry():
    """An empty registry, so a test's checks do not leak into the built-in one."""
    from distdoctor.core.registry import Registry

    return Registry()


@pytest.fixture
def clean_env(monkeypatch):
    """Remove launcher and distdoctor variables from the environment of this test."""
    prefixes = ("DISTDOCTOR_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "JSM_", "PET_")
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "GROUP_RANK", "ROLE_RANK")
    for key in list(os.environ):
        if key.startswith(prefixes) or key in names:
            monkeypatch.delenv(key, raising=False)
    return monkeypatch


def distdoctor_cmd(*args: str) -> list[str]:
    """The CLI as a user runs it, through this interpreter."""
    return [sys.executable, "-m", "distdoctor", *args]


def _time_torch_import() -> tuple[float, float]:
    """(when it started, how long) `python -c "import torch"` took, on time.monotonic()."""
    import subprocess
    import time

    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, timeout=300)
    return start, time.monotonic() - start


@functools.lru_cache(maxsize=1)
def measured_startup_s() -> float:
    """How long `python -c "import torch"` takes on this machine now (timed once per session).

    Tests that bound a wall time add a multiple of this to the deadline they configured, so a
    loaded machine (where the import alone takes 2-8 s) does not fail them; helpers that have no
    fixture at hand call this function.
    """
    return _time_torch_import()[1]


_RECENT_STARTUP: list[tuple[float, float]] = []  # (when measured, seconds)
RECENT_STARTUP_TTL_S = 120.0


def recent_startup_s() -> float:
    """The start-up measured within the last two minutes (timed again when older), never less than the
    session's: a deadline set from the session's first measurement alone was outlasted by a load burst
    later in the suite (a lab world's two ranks were cut off while still importing torch)."""
    import time

    if not _RECENT_STARTUP or time.monotonic() - _RECENT_STARTUP[-1][0] > RECENT_STARTUP_TTL_S:
        _RECENT_STARTUP.append(_time_torch_import())
    return max(measured_startup_s(), _RECENT_STARTUP[-1][1])


@pytest.fixture(scope="session")
def startup_s() -> float:
    """measured_startup_s() as a fixture."""
    return measured_startup_s()


def slack_s(startup: float, factor: float = 2.0) -> float:
    """The slack a wall-clock bound gets: a few seconds plus a multiple of the start-up time."""
    return 3.0 + factor * startup


def deadline_bound(timeout: float, grace: float = 1.0) -> float:
    """The wall time by which a distdoctor process given ``--timeout`` must have ended, measured
    from its Popen: its deadline and grace on its own clock, plus the interpreter's start before
    that clock starts and the load's delays, which scale with the measured start-up time."""
    return timeout + grace + 1.5 * measured_startup_s()


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago (the kernel's pick for port 0)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def json_objects(text: str) -> list[dict]:
    """Every JSON object printed on a stream, in order (one report, or one per rank with --all-ranks)."""
    import json

    decoder, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        value, i = decoder.raw_decode(text, i)
        out.append(value)


# Tests that share something only one of them can hold at a time run on one pytest-xdist worker,
# in their file order: the network-namespace hosts (fixed names and subnets, a last test that
# checks nothing was left behind) and the real SLURM cluster (one slurmctld/slurmd per session).
# A module whose module-scoped fixture runs real jobs for all its tests is kept on one worker too:
# split over two, each worker would run the jobs again (75 s of explain's real jobs, twice).
_ONE_WORKER_GROUPS = (("tests/hosts/", "hosts"), ("tests/launchers/", "launchers"),
                      ("tests/stacks/test_slurm_job.py", "launchers"),
                      *((path, path) for path in (
                          "tests/explain/test_real_jobs.py", "tests/explain/test_recorder_dumps.py",
                          "tests/explain/test_wrapped_jobs.py",
                          "tests/stacks/test_stacks_jobs.py", "tests/stacks/test_watch.py",
                          "tests/bench/test_bench_loopback.py", "tests/timeline/test_guard_pictures.py")))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the items (its own hook of this name)
def pytest_collection_modifyitems(config, items):
    for item in items:
        for prefix, group in _ONE_WORKER_GROUPS:
            if item.nodeid.startswith(prefix):
                item.add_marker(pytest.mark.xdist_group(group))


# Where the suite's CPU goes: with DISTDOCTOR_TEST_CPU_LOG=<file>, each test appends one line,
# "<nodeid>\t<CPU-s>\t<wall-s>", where CPU-s counts this worker and every process it reaped during
# the test (the ranks and launchers a test starts and waits for, their children included).
# docs/testing.md says how it was used to decide what the suite runs.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    log = os.environ.get("DISTDOCTOR_TEST_CPU_LOG")
    if not log:
        yield
        return
    import resource
    import time

    def cpu() -> float:
        own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime

    cpu0, wall0 = cpu(), time.monotonic()
    yield
    with open(log, "a") as out:
        out.write(f"{item.nodeid}\t{cpu() - cpu0:.2f}\t{time.monotonic() - wall0:.2f}\n")
