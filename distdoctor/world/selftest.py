"""The self-test world: N local ranks on this node, started with torch.multiprocessing.

`distdoctor check` with no launcher in the environment (or with ``--nproc N``) runs every stage
through a real world of N processes on loopback, as torchrun would start them, and reports once.

Why torch.multiprocessing with fork rather than torchrun's elastic agent: the supervisor imports
torch once and the ranks inherit it, so a 2-rank self-test costs one torch import instead of
three (the agent's and each worker's); benchmarks/ measure it against a bare torchrun script.
The supervisor plays the elastic agent's part: it hosts the store on a free loopback port (no
port race: it binds port 0 and hands the port to the ranks) and the ranks connect to it as
torchrun workers connect to the agent's store.

No process is left behind: every rank dies with the supervisor (PR_SET_PDEATHSIG), and the
supervisor ends any rank still alive after the run's deadline plus the watchdog's grace, by PID.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import secrets
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from multiprocessing.connection import wait as wait_for
from typing import Any, Callable

from distdoctor.core.config import Config
from distdoctor.core.engine import load_registry, report_from_runner
from distdoctor.core.stages import STAGES
from distdoctor.core.kinds import RUN_DEADLINE, TORCH_LACKS
from distdoctor.core.report import WorldSummary, build_report
from distdoctor.core.runner import Runner
from distdoctor.machine.host import build_context
from distdoctor.core.interrupt import (
    EXIT_SIGINT,
    EXIT_SIGTERM,
    exit_code_for,
    install_watcher,
    set_interrupt_handler,
    signal_name,
)
from distdoctor.core.progress import LiveStatus
from distdoctor.core.rank_groups import ranks_label, said_alike
from distdoctor.world.kinds import RANK_DIED, STORE_HOST_FAILED
from distdoctor.world.rank_run import run_rank
from distdoctor.world.rank_state import NON_ROOT_GRACE_S, working_reserve
from distdoctor.machine.launchers import SELF_TEST_VAR
from distdoctor.machine.torchrun_env import worker_thread_default
from distdoctor.core.report import EXIT_FINDINGS, EXIT_INCOMPLETE
from distdoctor.world.watchdog import (
    EXPIRE_GRACE_S,
    MIN_LOCAL_S,
    MIN_SELFTEST_S,
    flush_std_streams,
    too_little_time,
)
from distdoctor.world.store_api import serve_on_listener
from distdoctor.world.store_open import AGENT_STORE_ENV, RUN_ID_ENV

LOOPBACK = "127.0.0.1"
MP_SPAWN_ENV = SELF_TEST_VAR
MP_SPAWN_LAUNCHER = "mp_spawn"
# Past the ranks' own hard deadline (watchdog + grace), the supervisor ends them itself.
SUPERVISOR_SLACK_S = 1.0
NOT_REPORTED = -1
# How long the supervisor waits for rank 0's partial report after passing a signal on.
INTERRUPT_WAIT_S = 3.0


def default_nproc(gpu_count: int | None = None) -> int:
    """The number of GPUs, at least 2 (a world of one tests no communication)."""
    if gpu_count is None:
        gpu_count = visible_gpu_count()
    return max(2, gpu_count)


def visible_gpu_count() -> int:
    """GPUs visible here, without initialising CUDA in the supervisor (its children fork)."""
    try:
        # torch off the CLI's start-up path: only the self-test needs it here.
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:
        return 0


def _die_with_parent(parent: int) -> None:
    """Linux: this process gets SIGKILL when the supervisor dies, whatever killed it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os._exit(EXIT_INCOMPLETE)


def rank_environment(local_rank: int, nproc: int, port: int, run_id: str) -> dict[str, str]:
    env = {
        "RANK": str(local_rank),
        "WORLD_SIZE": str(nproc),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(nproc),
        "MASTER_ADDR": LOOPBACK,
        "MASTER_PORT": str(port),
        MP_SPAWN_ENV: "1",
        AGENT_STORE_ENV: str(True),
        RUN_ID_ENV: run_id,
    }
    # The self-test stands in for torchrun: a layout of distdoctor's own choosing must not be
    # reported as the job's CPU oversubscription.
    env.update(worker_thread_default(os.environ, nproc))
    return env


def _rank_main(
    local_rank: int,
    nproc: int,
    port: int,
    run_id: str,
    parent: int,
    config: Config,
    render: Callable[[Any], None],
    all_ranks: bool,
    started: float,
    argv: list[str],
    live_status: bool = False,
    rank_body: Callable[..., Any] | None = None,
    reported: Any = None,
) -> None:
    """One rank of the self-test world (runs in the forked child): ``rank_body`` (the bench's, say)
    or else the check's run_rank, called with the same arguments. ``reported``: a shared int the
    world's report sets to its exit code once it is out (_noting)."""
    _die_with_parent(parent)
    # The signal pipe and handler inherited from the supervisor are its own: watch our own.
    install_watcher()
    code = EXIT_INCOMPLETE
    try:
        os.environ.update(rank_environment(local_rank, nproc, port, run_id))
        rank_body = rank_body or run_rank
        # Rank 0 draws the status line (the supervisor cleared its own before starting the ranks).
        live = LiveStatus(live_status and local_rank == 0).start()
        says_for_world = local_rank == 0 or not all_ranks  # with --all-ranks every rank prints its own
        emit = _noting(render, reported, config.fail_level) if reported is not None and says_for_world else render
        outcome = rank_body(config, env=dict(os.environ), argv=argv, all_ranks=all_ranks, emit=live.wrap(emit),
                            started=started)
        live.stop()
        code = outcome.exit_code
    except BaseException as exc:  # never a traceback: say what happened and exit non-zero
        try:
            sys.stderr.write(f"distdoctor: self-test rank {local_rank} failed: {type(exc).__name__}: {exc}\n")
        except Exception:
            pass
        code = EXIT_FINDINGS
    finally:
        flush_std_streams()
        # Skip interpreter teardown: destructors of a process group whose peer hung can block.
        os._exit(code)


def _noting(render: Callable[[Any], None], reported: Any, fail_level: Any) -> Callable[[Any], None]:
    """render, then the report's exit code in ``reported``: the supervisor, which ends a rank still alive
    at its hard deadline, then knows the world's report is out and prints no second one (a rank starved
    of CPU on a loaded machine was ended between printing its partial report and its exit)."""
    def emit(report: Any) -> None:
        render(report)
        flush_std_streams()
        reported.value = report.exit_code(fail_level)

    return emit


def supervise(processes: list[Any], hard_deadline: float, error_files: list[str]) -> set[int]:
    """Wait for the ranks until they end or the hard deadline passes; end what is left (by PID)
    and return the indices of the ranks that had to be ended."""
    try:
        while True:
            alive = [p for p in processes if p.is_alive()]
            left = hard_deadline - time.monotonic()
            if not alive or left <= 0:
                break
            wait_for([p.sentinel for p in alive], timeout=left)
    finally:
        killed = end_processes(processes)
        for path in error_files:
            try:
                os.unlink(path)
            except OSError:
                pass
    return killed


def run_selftest(
    config: Config,
    render: Callable[[Any], None],
    *,
    nproc: int | None = None,
    all_ranks: bool = False,
    started: float | None = None,
    argv: list[str] | None = None,
    live: Any = None,
    rank_body: Callable[..., Any] | None = None,
) -> int:
    """Start the world, supervise it, return rank 0's exit code. Rank 0 prints the report.

    Each rank runs ``rank_body(config, env=, argv=, all_ranks=, emit=, started=)`` (an object
    with ``exit_code``); by default the check's run_rank. ``config`` needs ``timeout``,
    ``backend``, ``silence`` and ``fail_level``. SIGINT/SIGTERM go on to the ranks (rank 0
    prints the partial report); the supervisor then exits with 128 + the signal's number.
    """
    started = time.monotonic() if started is None else started
    import torch.multiprocessing as mp  # torch loads when a self-test starts, not with the CLI

    instead, size, config = _before_start(config, started, nproc=nproc, argv=argv, bench=rank_body is not None)
    if instead is not None:
        render(instead)
        return instead.exit_code(config.fail_level)
    # The store's socket listens before the ranks are forked, its server starts after: a process
    # forked while the store's server thread runs can inherit a lock that thread held, and its own
    # TCPStore client then never completes the handshake (seen as 1 rank in 16 "never checked in"
    # with 8x more ranks than cores). Connections made before the server starts wait in the backlog.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((LOOPBACK, 0))
    listener.listen(1024)
    port = listener.getsockname()[1]
    run_id = secrets.token_hex(6)
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    live_status = bool(live is not None and live.enabled)
    if live is not None:
        live.stop()  # no drawing thread across the fork; rank 0 draws from here on
    sys.stdout.flush()
    sys.stderr.flush()
    reported = mp.get_context(method).Value("i", NOT_REPORTED, lock=False)
    context = mp.start_processes(
        _rank_main,
        args=(size, port, run_id, os.getpid(), config, render, all_ranks, started, list(argv or sys.argv),
              live_status, rank_body, reported),
        nprocs=size,
        join=False,
        start_method=method,
    )
    processes = list(context.processes)
    store, instead = _host_store(listener, config, processes, started, size=size, argv=argv)
    if instead is not None:
        render(instead)
        return instead.exit_code(config.fail_level)
    set_interrupt_handler(lambda signum: interrupt_world(processes, signum))
    hard_deadline = started + config.timeout + NON_ROOT_GRACE_S + EXPIRE_GRACE_S + SUPERVISOR_SLACK_S
    try:
        # torch (2.3 on) records each rank's exception in a file it leaves behind; torch 2.1-2.2
        # used queues instead (ProcessContext.error_queues), and has no files to remove.
        killed = supervise(processes, hard_deadline, list(getattr(context, "error_files", None) or ()))
    finally:
        del store
    if INTERRUPTED.is_set():
        # The signal thread writes the last word and exits with 128 + signum (within its 5 s backstop).
        time.sleep(INTERRUPT_WAIT_S + 6.0)
    codes = {i: p.exitcode for i, p in enumerate(processes)}
    rank0 = codes.get(0)
    # Rank 0 reported by itself (after a signal too: 130, 143, its partial report is out).
    if rank0 in (0, EXIT_FINDINGS, EXIT_INCOMPLETE, EXIT_SIGINT, EXIT_SIGTERM) and 0 not in killed:
        return int(rank0)
    if reported.value != NOT_REPORTED:  # the world's report is out, its rank ended after it: one report only
        return int(reported.value)
    # Rank 0 did not end by itself, so it printed nothing: the supervisor says what it knows.
    report = abnormal_report(codes, killed, config, started, size)
    render(report)
    return report.exit_code(config.fail_level)


def _before_start(config: Config, started: float, *, nproc: int | None, argv: list[str] | None,
                  bench: bool) -> tuple[Any, int, Config]:
    """(a report to give instead of starting the world, or None; the world's size; the config the
    world runs with). Instead: a torch that cannot form a world, or too little time left."""
    import torch.distributed as dist  # torch loads when a self-test starts, not with the CLI

    unusable = world_unavailable(dist)
    if unusable is not None:
        return partial_report(config, started, size=nproc or 2, argv=argv, stage="rendezvous",
                              reason=unusable[0], extra=unusable[1], incomplete=False), nproc or 2, config
    gpus = visible_gpu_count()
    size = nproc or default_nproc(gpus)
    left = started + config.timeout - time.monotonic()
    if left < MIN_SELFTEST_S and not bench:  # (the bench has its own deadline handling)
        # Starting the ranks now would only end in a cut-off: report what this process can
        # tell in the time left, and name the stages that were not run.
        return out_of_time_report(config, started, size=size, argv=argv), size, config
    if config.backend is None and 0 < gpus < size:
        # More ranks than GPUs (one GPU, default N=2): one GPU per rank is impossible, so the
        # world runs gloo, as such a job would have to; nccl is tested when N <= GPUs.
        config = dataclasses.replace(config, backend="gloo")
    return None, size, config


def _host_store(listener: socket.socket, config: Config, processes: list[Any], started: float, *, size: int,
                argv: list[str] | None) -> tuple[Any, Any]:
    """(the world's store, served on a copy of ``listener``, which is closed here; or None and the
    report to give instead when neither store backend of this torch serves there, the ranks ended)."""
    port = listener.getsockname()[1]
    try:
        return serve_on_listener(LOOPBACK, port, listener.fileno(), wait_for_workers=False,
                                 timeout=timedelta(seconds=max(config.timeout, 1.0))), None
    except Exception as exc:
        # SIGKILL, not end_processes' SIGTERM: a rank forked a moment ago still has this process's
        # signal handler and wake-up descriptor, and would hand the SIGTERM to this process.
        for process in processes:
            if process.is_alive():
                try:
                    os.kill(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            process.join(timeout=2.0)
        return None, partial_report(
            config, started, size=size, argv=argv, stage="rendezvous",
            reason="skipped: the self-test could not host its store", incomplete=False, extra=[STORE_HOST_FAILED(
                f"The self-test could not host its store on {LOOPBACK}:{port}",
                detail=f"torch's TCPStore refused: {type(exc).__name__}: {str(exc).strip()[:300]}", check="selftest")])
    finally:
        listener.close()


def out_of_time_report(config: Config, started: float, *, size: int, argv: list[str] | None,
                       stage: str = "rendezvous", why: str = "") -> Any:
    """A partial report when the deadline leaves too little time for ``stage``: the stages before
    it run in this process with what is left, ``stage`` and the later ones are skipped and named."""
    left = started + config.timeout - time.monotonic()
    if stage != "local" and left - working_reserve(config.timeout) < MIN_LOCAL_S:
        stage, why = "local", why or "starting distdoctor and importing torch had taken the rest"
    need = {"local": MIN_LOCAL_S}.get(stage, MIN_SELFTEST_S)
    reason, finding = too_little_time(stage, left, need, config.timeout, why=why)
    return partial_report(config, started, size=size, argv=argv, stage=stage, reason=reason, extra=[finding])


def partial_report(config: Config, started: float, *, size: int, argv: list[str] | None, stage: str,
                   reason: str, extra: list[Any] = (), incomplete: bool = True) -> Any:
    """The stages before ``stage`` run in this process; ``stage`` and the later ones are skipped
    with ``reason``; ``extra`` findings say why."""
    registry = load_registry(config)
    ctx = build_context(config, argv=argv)
    budget = started + config.timeout - time.monotonic() - working_reserve(config.timeout)
    runner = Runner(registry, timeout=max(budget, 0.01), check_timeout=config.check_timeout,
                    silence=config.silence)
    runner.started = started
    checks = registry.select(config.stages, config.tags)
    for each in STAGES:  # run_stage runs only the selected checks of each stage
        runner.run_stage(each, checks, ctx, skip_reason=reason if STAGES.index(each) >= STAGES.index(stage) else None)
    world = WorldSummary(size=size, launcher=MP_SPAWN_LAUNCHER, ranks_reported=(), ranks_missing=())
    report = report_from_runner(runner, ctx, world, extra=list(extra))
    report.incomplete = incomplete
    return report


def world_unavailable(dist: Any) -> tuple[str, list[Any]] | None:
    """Why this torch cannot form a world at all (the skip reason, and a finding when the local
    stage has none to say it), or None. Looked up, not inferred from the version."""
    if not dist.is_available():
        # The local stage names it (backend.C001, critical).
        return "skipped: this torch is built without torch.distributed (backend.C001)", []
    missing = [name for name in ("TCPStore", "PrefixStore", "init_process_group") if not hasattr(dist, name)]
    if not missing:
        return None
    what = ", ".join(f"torch.distributed.{name}" for name in missing)
    return (f"skipped: this torch lacks {what}",
            [TORCH_LACKS(f"The self-test world could not be started: this torch lacks {what}",
                         detail="The self-test hosts a TCPStore and forms process groups through it; without these "
                         "interfaces no world can be formed here.", check="selftest")])


def abnormal_report(codes: dict[int, int | None], killed: set[int], config: Config, started: float, size: int) -> Any:
    def how(code: int | None) -> str:
        if code is None:
            return "did not exit"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    findings = []
    died = sorted(i for i, c in codes.items() if i not in killed and c not in (0, EXIT_FINDINGS, EXIT_INCOMPLETE))
    if died:
        findings.append(RANK_DIED(
            f"{ranks_label(died, capital=True)} of the self-test world ended without a report",
            detail="; ".join(said_alike(((i, how(codes[i])) for i in died), lambda label, text, ranks: f"{label} {text}")),
            ranks=died,
            check="selftest",
            data={"exit_codes": {str(i): codes[i] for i in died}},
        ))
    if killed:
        findings.append(RUN_DEADLINE(
            f"{ranks_label(killed, capital=True)} {'was' if len(killed) == 1 else 'were'} still running past the deadline and "
            f"{'was' if len(killed) == 1 else 'were'} ended",
            detail="The supervisor ended them by PID after the run's deadline and the watchdog's grace.",
            ranks=sorted(killed),
            check="selftest",
        ))
    return build_report(
        findings,
        world=WorldSummary(size=size, launcher=MP_SPAWN_LAUNCHER, ranks_reported=(), ranks_missing=tuple(sorted(set(died) | killed))),
        duration_s=time.monotonic() - started,
        incomplete=bool(killed),
        silence=config.silence,
    )


# Set when a signal is being handled: the supervisor's main flow then leaves the last word and
# the exit code to the signal thread (which ends the process) instead of reporting itself.
INTERRUPTED = threading.Event()


def interrupt_world(processes: list[Any], signum: int) -> None:
    """The supervisor got SIGINT/SIGTERM: pass it on to the ranks (rank 0 then prints the partial
    report and exits), wait for them briefly, end the rest by PID; one line if rank 0 said nothing."""
    INTERRUPTED.set()
    for p in processes:
        if p.is_alive():
            try:
                os.kill(p.pid, signum)
            except ProcessLookupError:
                pass
    until = time.monotonic() + INTERRUPT_WAIT_S
    for p in processes:
        p.join(timeout=max(until - time.monotonic(), 0))
    end_processes(processes)
    if processes and processes[0].exitcode != exit_code_for(signum):
        sys.stderr.write(f"distdoctor: interrupted by {signal_name(signum)} while the self-test world of "
                         f"{len(processes)} ranks ran; rank 0 wrote no report\n")


def end_processes(processes: list[Any], grace_s: float = 0.5) -> set[int]:
    """SIGTERM, then SIGKILL, every process still alive, by PID; returns the indices ended."""
    alive = {i: p for i, p in enumerate(processes) if p.is_alive()}
    for p in alive.values():
        try:
            os.kill(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    until = time.monotonic() + grace_s
    for p in alive.values():
        p.join(timeout=max(until - time.monotonic(), 0))
    for p in alive.values():
        if p.is_alive():
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.join(timeout=2.0)
    return set(alive)
