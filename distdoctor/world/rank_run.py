"""Cross-rank diagnosis for one rank: local stage, check-in, rendezvous and collective stages, one report.

Every rank runs :func:`run_rank`. The flow, and why each step is where it is:

1. local stage on every rank (no communication).
2. every rank connects to the store (distdoctor.world.store_exchange) and checks in: its local findings and
   check results, and a snapshot (host, pid, versions, NCCL_*/TORCH_*/GLOO_* settings, GPUs,
   the device it will use). A second process claiming a rank learns so from its claim number
   and stays out of the collectives (it would corrupt them), quietly.
3. rank 0 waits for the check-ins (until the run's working deadline), runs the rendezvous stage
   over them and publishes one decision: run the collective stage, or skip it and why. Every
   rank follows that decision, so nobody waits for a collective the others will not join.
4. collective stage on every accepted rank; each rank posts its results and marks itself done.
5. rank 0 gathers, names the ranks that did not finish, renders ONE report, then publishes the
   exit code; the other ranks exit with that code after rank 0 printed (under torchrun an early
   non-zero exit of a worker would make the agent kill rank 0 mid-report).

A watchdog (distdoctor.world.watchdog) holds the overall deadline: past it, rank 0 renders a partial
report naming the stage and the ranks that did not finish, and every rank exits with code 3.
Whenever a rank cannot hand its results to rank 0 (no store, no rank 0), it prints its own
report: somebody must.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from distdoctor.core.config import Config
from distdoctor.core.context import CheckContext
from distdoctor.machine.host import build_context
from distdoctor.core.interrupt import exit_code_for, set_interrupt_handler, signal_name
from distdoctor.core.kinds import RUN_DEADLINE, RUN_INTERRUPTED
from distdoctor.core.progress import PROGRESS
from distdoctor.core.engine import load_registry, report_from_runner
from distdoctor.core.findings import Finding, Severity
from distdoctor.machine.probes import Probes, call_with_deadline
from distdoctor.core.redact import secret_values
from distdoctor.core.registry import Registry
from distdoctor.core.stages import CROSS_RANK_STAGES, STAGES
from distdoctor.core.report import EXIT_INCOMPLETE, Report, WorldSummary, build_report, format_ranks
from distdoctor.core.runner import Runner
from distdoctor.machine.snapshot import collect_snapshot
from distdoctor.checks.rendezvous import collision_findings
from distdoctor.world.checkin import FINAL, malformed_finding
from distdoctor.world.kinds import (
    MASTER_NOT_HERE,
    NO_DECISION,
    STORE_DROPPED,
    STORE_ENTRY_MALFORMED,
    STORE_HOST_FAILED,
    STORE_PORT_TAKEN,
    STORE_UNREACHABLE,
)
from distdoctor.world.watchdog import MIN_WORLD_S, Watchdog, flush_std_streams, running_checks, too_little_time
from distdoctor.world.store_exchange import DECISION, Arrival, CheckIns, World, WorldError, WorldSpec, fit


# The promise is a report within the deadline + 1 s. Rank 0's watchdog fires this long before
# the deadline, so that its store reads (each bounded by STORE_READ_S) and the rendering of the
# partial report are done by the deadline (measured: ~0.1 s for a 2-rank partial report).
ROOT_MARGIN_S = 0.4
STORE_READ_S = 0.25
# Rank 0's watchdog exits the process at the latest this long after it fired.
ROOT_EXPIRE_GRACE_S = 0.9
# Non-root ranks keep their watchdog this much longer than the deadline, so that rank 0 (which
# knows the most) is the one that reports when a deadline passes; they wait for rank 0's word
# until MEMBER_WAIT_S past the deadline, and exit at the latest MEMBER_EXPIRE_GRACE_S after their
# watchdog fired: all of it inside the deadline + 1 s.
NON_ROOT_GRACE_S = 0.4
MEMBER_WAIT_S = 0.2
MEMBER_EXPIRE_GRACE_S = 0.5
# After the last expected rank checked in, rank 0 listens this much longer so that a second
# process claiming a rank at nearly the same moment is still caught before the collectives.
SETTLE_S = 0.05
# How long rank 0 waits for the others' goodbyes before releasing a store it hosts (after a
# normal end, and after its watchdog fired: members poll every 0.1 s at most).
GOODBYE_S = 1.0
GOODBYE_ON_EXPIRE_S = 0.3
# How long a flow that lost the race to report waits for the winner's report to be written.
EMIT_WAIT_S = 3.0

def working_reserve(timeout: float) -> float:
    """Time kept back from the run's deadline for gathering and rendering the report."""
    return min(max(0.1 * timeout, 0.5), 2.0)


# -- what a rank tells the others -------------------------------------------------------------
def device_mapping(ctx: CheckContext) -> dict[str, Any] | None:
    """The GPU this rank will use, as the usual script picks it (cuda:LOCAL_RANK), by UUID."""
    gpus = ctx.gpus()
    if not isinstance(gpus, list) or not gpus:
        return None
    local = ctx.launch.local_rank.value
    if len(gpus) == 1:
        gpu, how = gpus[0], "the only GPU this rank sees"
    elif local is not None and local < len(gpus):
        gpu, how = gpus[local], f"cuda:{local} (LOCAL_RANK) of {len(gpus)} visible GPUs"
    else:
        return None
    return {"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "how": how}


def node_rank(ctx: CheckContext) -> int | None:
    launch = ctx.launch
    # machine.launchers reads GROUP_RANK / SLURM_NODEID / NODE_RANK, bounded: never a ValueError.
    return launch.node_rank.value if launch.node_rank is not None else None


def checkin_payload(ctx: CheckContext, runner: Runner) -> dict[str, Any]:
    snapshot = collect_snapshot(ctx)
    payload = {
        "host": snapshot.get("host"),
        "pid": snapshot.get("pid"),
        "snapshot": snapshot,
        "node_rank": node_rank(ctx),
        "local_rank": ctx.launch.local_rank.value,
        "local_world_size": ctx.launch.local_world_size.value,
        "device": device_mapping(ctx),
        "findings": [f.to_dict() for f in runner.state.findings],
        "checks": [r.to_dict() for r in runner.state.results],
    }
    payload["snapshot"] = fit(snapshot, 40 * 1024, droppable=("interfaces", "platform", "gpus", "env"))
    return fit(payload, droppable=("findings",))


# -- merging check entries across ranks -------------------------------------------------------
def merge_check_entries(entries: Iterable[tuple[Sequence[int], Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One entry per (check, stage, status, reason), with the ranks it holds for."""
    merged: dict[tuple, dict[str, Any]] = {}
    for ranks, entry in entries:
        key = (entry.get("name"), entry.get("stage"), entry.get("status"), entry.get("reason", ""))
        if key not in merged:
            merged[key] = {**entry, "ranks": set(ranks)}
        else:
            target = merged[key]
            target["ranks"].update(ranks)
            target["duration_s"] = max(float(target.get("duration_s", 0.0)), float(entry.get("duration_s", 0.0)))
    out = [{**e, "ranks": sorted(e["ranks"])} for e in merged.values()]
    order = {s: i for i, s in enumerate(STAGES)}
    return sorted(out, key=lambda e: order.get(e.get("stage"), len(order)))


def _findings_from(raw: Iterable[Mapping[str, Any]]) -> list[Finding]:
    out = []
    for item in raw or ():
        try:
            out.append(Finding.from_dict(item))
        except (KeyError, ValueError, TypeError):
            continue  # a malformed finding from another rank is dropped, not trusted
    return out


# -- the run of one rank ----------------------------------------------------------------------
@dataclass
class RankOutcome:
    report: Report | None
    exit_code: int
    # True when this process rendered a report (rank 0, --all-ranks, or a rank on its own).
    reported: bool = False
    world_opened: bool = False
    # The environment described a world, so torch.distributed was loaded (and maybe a store
    # client that failed): the CLI ends such a process with os._exit once the report is out,
    # since torch's interpreter teardown alone takes 0.4-1.2 s on a busy node.
    world_described: bool = False


@dataclass
class _Progress:
    """What rank 0 knows so far; the watchdog builds the partial report from it."""

    stage: str = "local"
    expected: list[int] = field(default_factory=list)
    checkins: CheckIns | None = None
    remote: dict[int, dict[str, Any]] = field(default_factory=dict)


class RankRun:
    def __init__(
        self,
        config: Config,
        *,
        env: Mapping[str, str] | None = None,
        argv: Sequence[str] | None = None,
        probes: Probes | None = None,
        registry: Registry | None = None,
        all_ranks: bool = False,
        emit: Callable[[Report], None] | None = None,
        started: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        exit: Callable[[int], None] = os._exit,
        watchdog: bool = True,
        teardown: bool = False,
        note: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.started = clock() if started is None else started
        self.deadline = self.started + config.timeout
        self.work_deadline = self.deadline - working_reserve(config.timeout)
        self.registry = load_registry(config, registry)
        self.ctx = build_context(config, env=env, argv=argv, probes=probes)
        self.runner = Runner(
            self.registry,
            timeout=max(self.work_deadline - clock(), 0.01),
            check_timeout=config.check_timeout,
            silence=config.silence,
            clock=clock,
        )
        self.runner.started = self.started  # durations count from the process's start
        self.checks = self.registry.select(config.stages, config.tags)
        self.all_ranks = all_ranks
        self.emit = emit
        self.exit = exit
        self.use_watchdog = watchdog
        # Embedded runs (diagnose() from the API or the pytest plugin) leave no process group
        # behind; the CLI ends the process right after the report instead.
        self.teardown = teardown
        # Where a rank other than 0 writes its one line instead of a report (see _render).
        self.note = note
        self.world: World | None = None
        self.progress = _Progress()
        self.rank = self.ctx.rank if self.ctx.rank is not None else 0
        # One report per process: the main flow and the watchdog race for it near the deadline.
        self._report_lock = threading.Lock()
        self._reported_code: int | None = None
        # Set once the report is written: a flow that lost the race waits for it before the
        # process may exit, or the exit would cut the winner's report off (or lose it whole).
        self._emitted = threading.Event()
        self._described = False

    # -- helpers -------------------------------------------------------------------------
    def _enter_stage(self, stage: str) -> None:
        self.progress.stage = stage
        PROGRESS.set_stage(stage)

    def _stage(self, stage: str, skip_reason: str | None = None) -> None:
        self._enter_stage(stage)
        if stage in self.config.stages:
            self.runner.run_stage(stage, self.checks, self.ctx, skip_reason=skip_reason)

    def _own_report(self, extra: Iterable[Finding] = ()) -> Report:
        return report_from_runner(self.runner, self.ctx, extra=[*extra, *self._store_malformed()], ranks=[self.rank])

    def _store_malformed(self) -> list[Finding]:
        """The malformed store entries this process met, as one finding (none when there were none)."""
        if self.world is None:
            return []
        finding = malformed_finding(self.world.protocol, self.rank, STORE_ENTRY_MALFORMED, check="rendezvous.store")
        return [finding] if finding is not None else []

    def _render(self, report: Report, code: int | None = None) -> bool:
        """Emit the report unless this process already emitted one (the first one wins)."""
        with self._report_lock:
            lost = self._reported_code is not None
            if not lost:
                self._reported_code = report.exit_code(self.config.fail_level) if code is None else code
        if lost:
            self._emitted.wait(EMIT_WAIT_S)  # outside the lock: the winner is writing
            return False
        try:
            if self._defers_report():
                # One report per world, rank 0's: this rank says in one line why it has none of its own.
                if self.note is not None:
                    self.note(pointer_line(self.rank, self.ctx.world_size, self._host_text(), report))
                    flush_std_streams()
                return False
            if self.emit is None:
                return False
            self.emit(report)
            flush_std_streams()
            return True
        finally:
            self._emitted.set()

    def _defers_report(self) -> bool:
        """Whether another process prints the report this rank's results belong to."""
        if self.all_ranks or self.ctx.rank is None:
            return False
        if self.rank != 0:
            return True
        # torchrun inside a multi-task srun/mpirun step (launch.E004): each task's torchrun forms
        # a world of its own; the world of the scheduler's task 0 prints the one report.
        scheduler_rank = self.ctx.launch.scheduler_rank
        return self.ctx.launch.launcher == "torchrun" and scheduler_rank is not None and bool(scheduler_rank.value)

    def _finish_alone(self, extra: Iterable[Finding] = ()) -> RankOutcome:
        """This rank could not hand its results to rank 0: it reports for itself."""
        report = self._own_report(extra)
        code = report.exit_code(self.config.fail_level)
        return RankOutcome(report, code, self._render(report, code), self.world is not None, self._described)

    # -- the flow ------------------------------------------------------------------------
    def run(self) -> RankOutcome:
        spec = WorldSpec.from_launch(self.ctx.launch, self.ctx.env)
        root = self.rank == 0
        watchdog = Watchdog(
            self.deadline + (-ROOT_MARGIN_S if root else NON_ROOT_GRACE_S),
            self._on_deadline,
            clock=self.clock,
            exit=self.exit,
            grace_s=ROOT_EXPIRE_GRACE_S if root else MEMBER_EXPIRE_GRACE_S,
        )
        if self.use_watchdog:
            watchdog.start()
        previous_handler = set_interrupt_handler(self._on_interrupt) if self.use_watchdog else None
        try:
            self._described = spec is not None
            if spec is not None:
                # Every check of a rank needs torch; importing it here (seconds on a busy node)
                # keeps that time out of the first check's own deadline.
                import torch.distributed  # noqa: F401
            self._testing_hang("local")
            self._stage("local")
            if spec is None:
                # No usable world (the local stage says why): the cross-rank stages cannot run.
                reason = "skipped: the environment does not describe a usable world (see the launch findings)"
                for stage in CROSS_RANK_STAGES:
                    self._stage(stage, skip_reason=reason)
                return self._finish_alone()
            # A rank with critical local findings still checks in (saying so), so that rank 0
            # reports for the whole world, once, and skips the collectives for every rank.
            return self._run_in_world(spec)
        finally:
            watchdog.cancel()
            if self.use_watchdog:
                set_interrupt_handler(previous_handler)

    def _run_in_world(self, spec: WorldSpec) -> RankOutcome:
        self._enter_stage("rendezvous")
        left = self.work_deadline - self.clock()
        if left < MIN_WORLD_S:
            return self._out_of_time(left)
        try:
            self.world = World.open(spec, self.work_deadline, self.clock, self.ctx.probes)
        except WorldError as exc:
            if exc.reason == "no_time":
                return self._out_of_time(self.work_deadline - self.clock())
            hosting = spec.store_host == "rank0" and spec.rank == 0
            reason = ("skipped: rank 0 could not host the rendezvous store" if hosting
                      else "skipped: the rendezvous store could not be reached")
            for stage in CROSS_RANK_STAGES:
                self._stage(stage, skip_reason=reason)
            return self._finish_alone([self._store_finding(spec, exc)])
        world = self.world
        self.ctx.world = world
        try:
            world.check_in({**checkin_payload(self.ctx, self.runner), "blocked": self._blocked()}, self.work_deadline)
        except Exception as exc:  # the store dropped this connection (its host ended, or refused us)
            reason = "skipped: the rendezvous store stopped answering during the check-in"
            for stage in CROSS_RANK_STAGES:
                self._stage(stage, skip_reason=reason)
            return self._finish_alone([STORE_UNREACHABLE(
                f"Rank {spec.rank}: the store at {spec.master_addr}:{spec.master_port} stopped answering "
                "during the check-in", detail=str(exc).strip().splitlines()[0][:300] if str(exc).strip() else
                type(exc).__name__, ranks=(spec.rank,), hosts=self._host())])
        if world.is_duplicate:
            return self._run_as_duplicate()
        if world.rank == 0:
            return self._run_root()
        return self._run_member()

    def _out_of_time(self, left: float) -> RankOutcome:
        """Too little time is left for the cross-rank stages: skip them with that reason.

        Not a finding about the network. Rank 0 reports (every rank's deadline counts from
        about the same moment, so the others are in the same position and stay quiet).
        """
        reason, finding = too_little_time("rendezvous", left, MIN_WORLD_S, self.config.timeout)
        for stage in CROSS_RANK_STAGES:
            self._stage(stage, skip_reason=reason)
        self.runner.state.incomplete = True
        if self.rank != 0 and not self.all_ranks:
            report = self._own_report([finding])
            with self._report_lock:
                self._reported_code = EXIT_INCOMPLETE
            self._emitted.set()
            return RankOutcome(report, EXIT_INCOMPLETE, False, False, self._described)
        return self._finish_alone([finding])

    def _store_finding(self, spec: WorldSpec, exc: WorldError) -> Finding:
        """What the failure to reach (or host) the store says, as the finding that names it."""
        where = f"{spec.master_addr}:{spec.master_port}"
        data = {"master_addr": spec.master_addr, "master_port": spec.master_port, "store_host": spec.store_host,
                **exc.data}
        common = {"detail": str(exc), "ranks": (spec.rank,), "hosts": self._host(), "data": data}
        probe = exc.data.get("probe")
        if spec.rank != 0 and exc.reason not in ("port_taken", "host_failed", "master_not_here"):
            # A process on this host holds the port and is not rank 0's store: say what rank 0
            # says (net.E013 naming the holder), not "unreachable" or "firewall".
            from distdoctor.checks.network import port_held_finding

            held = port_held_finding(self.ctx, spec.master_addr, spec.master_port)
            if held is not None:
                return dataclasses.replace(held, ranks=(spec.rank,), hosts=self._host())
        if exc.reason == "port_taken":
            return STORE_PORT_TAKEN(f"Rank 0 could not host the store: port {spec.master_port} is taken", **common)
        if exc.reason == "host_failed":
            return STORE_HOST_FAILED(f"Rank 0 could not host the store on port {spec.master_port}: "
                                     f"{exc.data.get('error', exc)}", **common)
        if exc.reason == "master_not_here":
            mine = self._own_addresses()
            answer = {"no_host": "no host answers there", "refused": "another host answers there",
                      "no_route": "there is no route to it", "timeout": "connects to it time out",
                      "not_local": "it cannot be bound here"}.get(
                          str(probe), "it does not lead here")
            return MASTER_NOT_HERE(
                f"MASTER_ADDR={spec.master_addr} is not an address of rank 0's host ({self._host_text()}), "
                f"and {answer}",
                remediation=f"Rank 0 hosts the store, so MASTER_ADDR must be an address of rank 0's host: set "
                f"MASTER_ADDR to {mine} on every rank, or start rank 0 on the host that has {spec.master_addr}",
                **{**common, "data": {**data, "own_addresses": mine}},
            )
        if exc.reason == "dropped":
            return STORE_DROPPED(
                f"Rank {spec.rank}: connections to the store at {where} time out (packets dropped)",
                remediation=f"Allow TCP {spec.master_port} from this host ({self._host_text()}) to "
                f"{spec.master_addr}, and the backend's ports between the nodes: the firewall on the master "
                f"(firewall-cmd --add-port={spec.master_port}/tcp), the security group, or a network policy; "
                f"check with `nc -vz {spec.master_addr} {spec.master_port}` from here",
                **common,
            )
        title = {
            "refused": f"Rank {spec.rank}: nothing listens at {where} (connection refused)",
            "no_host": f"Rank {spec.rank}: no host answers at {spec.master_addr} (store at {where})",
            "no_route": f"Rank {spec.rank}: no route to the store at {where}",
            "unresolvable": f"Rank {spec.rank}: the store's host {spec.master_addr} does not resolve",
        }.get(str(probe), f"Rank {spec.rank} could not reach the store at {where}")
        return STORE_UNREACHABLE(title, **common)

    def _host_text(self) -> str:
        host = self._host()
        return host[0] if host else "this host"

    def _own_addresses(self) -> str:
        nics = self.ctx.probes.interfaces()
        if not isinstance(nics, dict):
            return "this host's address (see `ip -br addr`)"
        found = [f"{a} ({n.name})" for n in nics.values() if n.up and not n.is_loopback for a in n.ipv4]
        return " or ".join(found[:4]) if found else "this host's address (see `ip -br addr`)"

    def _blocked(self) -> str | None:
        """Why this rank cannot join the world at all: a critical local finding (not silenced)."""
        blocking = [f for f in self.runner.state.blocking_findings() if not self.runner.is_silenced(f)]
        if not blocking:
            return None
        return f"skipped: critical findings in an earlier stage ({', '.join(sorted({f.id for f in blocking}))})"

    def _host(self) -> tuple[str, ...]:
        host = self.ctx.memo("hostname", self.ctx.probes.hostname)
        return (host,) if isinstance(host, str) else ()

    # -- rank 0 --------------------------------------------------------------------------
    def _run_root(self) -> RankOutcome:
        world = self.world
        assert world is not None
        self.progress.expected = list(range(world.size))
        self._testing_hang("rendezvous")
        # Stop waiting early enough that the rendezvous checks still run before the deadline.
        checkin_deadline = self.work_deadline - working_reserve(self.config.timeout)
        checkins = world.wait_for_checkins(checkin_deadline, settle_s=SETTLE_S)
        world.checkins = checkins
        self.progress.checkins = checkins
        self._stage("rendezvous")
        accepted = sorted(r for r in checkins.accepted if 0 <= r < world.size)
        skip = None
        if "collective" not in self.config.stages:
            skip = "skipped: the collective stage was not selected"
        else:
            skip = self.runner.skip_reason("collective", self.ctx)
            if skip is None and checkins.missing:
                skip = f"skipped: ranks {format_ranks(checkins.missing)} never checked in"
        blocked = {r: p["blocked"] for r, p in checkins.accepted.items()
                   if r != 0 and 0 <= r < world.size and p.get("blocked")}
        if skip is None and blocked:
            skip = f"skipped: {_ranks(sorted(blocked))} cannot join ({next(iter(blocked.values()))})"
        blockers = group_blockers(checkins)
        if skip is None and blockers["gloo"]:
            skip = ("skipped: the gloo process group cannot form, as these ranks' local findings show: "
                    + "; ".join(blockers["gloo"]))
        decision = {"skip": skip, "accepted": accepted, "size": world.size,
                    **nccl_decision(checkins, self.config, blockers["nccl"])}
        world.decide(decision)
        self.progress.expected = accepted
        self._stage("collective", skip_reason=skip)
        self._testing_hang("gather")
        others = [r for r in accepted if r != 0]
        self._enter_stage("collective")
        done = world.wait_done("collective", others, self.work_deadline) if others else set()
        self.progress.remote = world.results("collective", done)
        not_done = sorted(set(others) - done)
        cut_off = sorted(r for r, res in self.progress.remote.items() if isinstance(res, dict) and res.get("incomplete"))
        if self.runner.state.incomplete:
            cut_off = sorted({0, *cut_off})
        if not_done or cut_off:
            self._mark_stuck(not_done, cut_off)
        report = self._consolidated(extra=self._late_duplicates(checkins))
        code = report.exit_code(self.config.fail_level)
        reported = self._render(report, code)
        reported_claims = sorted(f"{r}:{c}" for r, c in checkins.payloads)
        world.put("final", {"exit": code, "claims": reported_claims})
        self._release(expect_goodbyes=len(checkins.arrivals) - 1)
        return RankOutcome(report, code, reported, True)

    def _mark_stuck(self, not_done: list[int], cut_off: list[int]) -> None:
        stuck = sorted(set(not_done) | set(cut_off))
        stuck_checks = sorted({
            str(self.progress.remote.get(r, {}).get("stuck_check"))
            for r in cut_off if self.progress.remote.get(r, {}).get("stuck_check")
        })
        detail = []
        if not_done:
            detail.append(f"{_ranks(not_done).capitalize()} never reported the end of the collective stage.")
        if cut_off:
            detail.append(f"{_ranks(cut_off).capitalize()} were cut off by their deadline inside it"
                          + (f" (in {', '.join(stuck_checks)})." if stuck_checks else "."))
        self.runner.state.incomplete = False  # re-marked below with the ranks named
        self.runner.state.findings = [f for f in self.runner.state.findings if f.id != RUN_DEADLINE.id]
        self.runner.mark_incomplete("collective", self.ctx, stuck, " ".join(detail))

    def _late_duplicates(self, checkins: CheckIns) -> list[Finding]:
        """Processes that claimed a rank after the check-in phase: named too."""
        world = self.world
        assert world is not None
        try:
            late, _ = world.late_claims(list(checkins.payloads) + list(checkins.unreadable))
        except Exception:
            return []
        if not late:
            return []
        for rank, claim in late:
            checkins.arrivals.append(Arrival(rank, claim, checkins.waited_s))
        checkins.payloads.update(late)
        return collision_findings(checkins, only_ranks={r for r, _ in late})

    def _consolidated(self, extra: Iterable[Finding] = ()) -> Report:
        checkins = self.progress.checkins
        findings: list[Finding] = [*self.registry.load_problems, *self.runner.state.findings, *extra,
                                   *self._store_malformed()]
        examined = checkins.reported if checkins else [0]
        entries: list[tuple[Sequence[int], Mapping[str, Any]]] = []
        for result in self.runner.state.results:
            ranks = examined if result.stage == "rendezvous" else [0]
            entries.append((ranks, result.to_dict()))
        if checkins:
            for rank, payload in sorted(checkins.accepted.items()):
                if rank == 0 or not 0 <= rank < checkins.expected:
                    continue
                findings += _findings_from(payload.get("findings", ()))
                entries += [([rank], c) for c in payload.get("checks", ()) if isinstance(c, Mapping)]
        for rank, result in sorted(self.progress.remote.items()):
            if not isinstance(result, Mapping):
                continue
            findings += _findings_from(result.get("findings", ()))
            entries += [([rank], c) for c in result.get("checks", ()) if isinstance(c, Mapping)]
        world = self.world
        summary = WorldSummary(
            size=world.size if world else self.ctx.world_size,
            launcher=self.ctx.launch.launcher,
            ranks_reported=tuple(checkins.reported) if checkins else (self.rank,),
            ranks_missing=tuple(checkins.missing) if checkins else (),
        )
        return build_report(
            findings,
            merge_check_entries(entries),
            world=summary,
            duration_s=self.clock() - self.started,
            incomplete=self.runner.state.incomplete,
            silence=self.config.silence,
            secrets=secret_values(self.ctx.env),
        )

    def _release(self, expect_goodbyes: int) -> None:
        world = self.world
        assert world is not None
        if world.hosted and expect_goodbyes > 0:
            # The others read "final" from the store this process hosts: let them, briefly.
            world.await_goodbyes(expect_goodbyes, min(self.clock() + GOODBYE_S, self.deadline - ROOT_MARGIN_S))
        world.close(destroy_groups=self.teardown)

    # -- the other ranks -----------------------------------------------------------------
    def _run_member(self) -> RankOutcome:
        world = self.world
        assert world is not None
        self._testing_hang("rendezvous")
        # Rank 0 decides only when its check-in wait ends: wait for it up to this rank's own end,
        # or for rank 0's final word if its deadline ended the run before it decided.
        key, decision = world.fetch_first({"decision": DECISION, "final": FINAL}, self.deadline + MEMBER_WAIT_S)
        if key == "final" and isinstance(decision, dict):
            reason = "skipped: rank 0 ended the run (its deadline passed) before it published a decision"
            self._stage("rendezvous", skip_reason=reason)
            self._stage("collective", skip_reason=reason)
            return self._finish_member(decision)
        if not isinstance(decision, dict):
            reason = "skipped: rank 0 published no decision before this rank's deadline"
            self._stage("rendezvous", skip_reason=reason)
            self._stage("collective", skip_reason=reason)
            finding = NO_DECISION(
                ranks=(world.rank,),
                hosts=self._host(),
                detail="This rank checked in, but rank 0 never published the outcome of the check-in "
                "(rank 0 not started, stuck, or killed)." + (f" Then {world.lost}." if world.lost else ""),
            )
            self.runner.mark_incomplete("rendezvous", self.ctx, (0,), "Rank 0 did not finish the rendezvous stage.")
            return self._finish_member(None, [finding])
        world.decision = decision
        skip = decision.get("skip")
        if skip is None and world.rank not in decision.get("accepted", ()):
            skip = f"skipped: rank {world.rank} is not part of rank 0's world of {decision.get('size')}"
        if skip is None and decision.get("size") != world.size:
            skip = f"skipped: WORLD_SIZE here ({world.size}) differs from rank 0's ({decision.get('size')})"
        self._stage("collective", skip_reason=skip)
        self._testing_hang("gather")
        try:
            world.mark_done("collective", self._results_message())
        except Exception as exc:
            world.lost = f"the store went away: {exc}"
            return self._finish_member(None)
        _, final = world.fetch_first({"final": FINAL}, self.deadline + MEMBER_WAIT_S)
        return self._finish_member(final)

    def _results_message(self) -> dict[str, Any]:
        results = [r for r in self.runner.state.results if r.stage == "collective"]
        stuck = next((r.name for r in results if r.status == "timeout"), None)
        findings = [f for r in results for f in r.findings]
        findings += [f for f in self.runner.state.findings if f.id == RUN_DEADLINE.id]
        findings += self._store_malformed()
        return fit(
            {
                "checks": [r.to_dict() for r in results],
                "findings": [f.to_dict() for f in findings],
                "incomplete": self.runner.state.incomplete,
                "stuck_check": stuck,
            },
            droppable=("findings",),
        )

    def _run_as_duplicate(self) -> RankOutcome:
        """A second process claiming a taken rank: it stays out of the collectives, quietly."""
        world = self.world
        assert world is not None
        reason = f"skipped: another process already claimed rank {world.rank}"
        self._stage("rendezvous", skip_reason=reason)
        self._stage("collective", skip_reason=reason)
        _, final = world.fetch_first({"final": FINAL}, self.deadline + MEMBER_WAIT_S)
        claims = final.get("claims") if isinstance(final, dict) else None
        if claims is not None and f"{world.rank}:{world.claim}" not in claims:
            # Rank 0 finished before this process arrived: nobody else will name the collision.
            return self._finish_alone(self._own_collision())
        return self._finish_member(final)

    def _own_collision(self) -> list[Finding]:
        world = self.world
        assert world is not None and world.claim is not None
        try:
            keys = [(r, c) for r, c in world.roster() if r == world.rank and c <= world.claim]
            payloads, _ = world.read_checkins(keys)
        except Exception:
            payloads = {}
        keys = sorted(payloads)
        checkins = CheckIns(world.size, [Arrival(r, c, 0.0) for r, c in keys], payloads)
        return collision_findings(checkins)

    def _finish_member(self, final: Any, extra: Iterable[Finding] = ()) -> RankOutcome:
        world = self.world
        report = self._own_report(extra)
        if isinstance(final, dict) and isinstance(final.get("exit"), int):
            code = int(final["exit"])
            reported = self._render(report, code) if self.all_ranks else False
        else:
            # Rank 0 never said how it went: this rank reports what it knows itself.
            if not self.runner.state.incomplete:
                why = f" ({world.lost})" if world is not None and world.lost else ""
                self.runner.mark_incomplete("collective", self.ctx, (0,),
                                            f"Rank 0 published no final report before this rank's deadline{why}.")
                report = self._own_report(extra)
            code = report.exit_code(self.config.fail_level)
            reported = self._render(report, code)
        if world is not None:
            try:
                world.say_goodbye()
            except Exception:
                pass
            world.close(destroy_groups=self.teardown)
        return RankOutcome(report, code, reported, True)

    # -- the deadline --------------------------------------------------------------------
    def _on_deadline(self) -> int | None:
        """Watchdog thread: the main flow is stuck. Rank 0 renders what it knows; others stay quiet.

        Returns the exit code when the main flow already reported (it was finishing just as the
        watchdog fired): the process then ends with that report's code, not with 3.
        """
        return self._last_word(EXIT_INCOMPLETE)

    def _on_interrupt(self, signum: int) -> None:
        """Signal thread (SIGINT/SIGTERM): rank 0 renders the partial report naming the stage; the
        process then exits with 128 + the signal's number."""
        self._last_word(exit_code_for(signum), interrupted=signal_name(signum))

    def _last_word(self, code: int, interrupted: str | None = None) -> int | None:
        with self._report_lock:
            if self._reported_code is not None:
                return self._reported_code
        is_root = self.world is not None and self.world.is_root and self.world.rank == 0
        if not is_root and not self.all_ranks:
            if self.rank == 0 or not self._described:
                # Rank 0 stuck before it reached the world (in the local stage), or a process
                # with no world at all: it reports for itself. Other ranks stay quiet: rank 0
                # names them as missing (under the self-test, the supervisor speaks if it cannot).
                self._render(self._partial(None, interrupted), code)
            return None
        if not self._render(self._partial(self.world if is_root else None, interrupted), code):
            with self._report_lock:
                if self._reported_code is not None and self._reported_code != code:
                    return self._reported_code
        if is_root and self.world is not None:
            # Tell the others (bounded: the store may be what hangs) so they end quietly.
            world = self.world
            claims = sorted(f"{r}:{c}" for r, c in (self.progress.checkins.payloads if self.progress.checkins else {}))
            call_with_deadline(lambda: world.put("final", {"exit": code, "claims": claims}),
                               STORE_READ_S, "final")
            if world.hosted:
                # The store ends with this process: let the others read the final word first.
                arrived = len(self.progress.checkins.arrivals) if self.progress.checkins else self._roster_size(world)
                if arrived > 1:
                    world.await_goodbyes(arrived - 1, self.clock() + GOODBYE_ON_EXPIRE_S)
        return None

    def _roster_size(self, world: World) -> int:
        roster = call_with_deadline(world.roster, STORE_READ_S, "roster")
        return len(roster) if isinstance(roster, list) else 0

    def _partial(self, world: World | None, interrupted: str | None = None) -> Report:
        stage = self.progress.stage
        stuck: list[int] = [self.rank]
        if world is not None and stage in CROSS_RANK_STAGES:
            expected = self.progress.expected or list(range(world.size))
            if stage == "rendezvous" and self.progress.checkins is None:
                roster = call_with_deadline(world.roster, STORE_READ_S, "roster")
                arrived = {r for r, _ in roster} if isinstance(roster, list) else set()
                stuck = [r for r in expected if r not in arrived] or [0]
            else:
                done = call_with_deadline(lambda: world.done_ranks(stage), STORE_READ_S, "progress")
                done = done if isinstance(done, set) else set()
                stuck = sorted({0, *(r for r in expected if r != 0 and r not in done)})
        running = running_checks({r.name for r in list(self.runner.state.results)})
        deadline_finding = self._cutoff_finding(stage, stuck, running, interrupted)
        findings = [f for f in list(self.runner.state.findings) if f.id not in (RUN_DEADLINE.id, RUN_INTERRUPTED.id)]
        self.runner.state.findings = findings
        self.runner.state.incomplete = True
        if world is not None:
            report = self._consolidated(extra=[deadline_finding])
        else:
            report = self._own_report([deadline_finding])
        # One word on the cut-off: the main flow may have marked its own stage meanwhile (its
        # runner's core.E004, check "runner"); the watchdog's names the stage and ranks for all.
        report.findings = [f for f in report.findings
                           if f.id not in (RUN_DEADLINE.id, RUN_INTERRUPTED.id) or f.check in ("watchdog", "signal")]
        report.incomplete = True
        return report

    def _cutoff_finding(self, stage: str, stuck: list[int], running: list[str], signame: str | None) -> Finding:
        """The word on a cut-off run: the deadline (core.E004), or a signal when ``signame`` (core.E006)."""
        doing = f" (running: {', '.join(running)})" if running else ""
        during = f", while {', '.join(running)} {'was' if len(running) == 1 else 'were'} running" if running else ""
        data = {"stage": stage, "running": running}
        if signame:
            return RUN_INTERRUPTED(
                f"The {stage} stage was interrupted by {signame} on ranks {format_ranks(stuck)}{doing}",
                detail=f"distdoctor received {signame} {self.clock() - self.started:.1f}s after it started, "
                f"in the {stage} stage{during}; the report is partial.",
                ranks=stuck, check="signal", data={**data, "signal": signame},
            )
        return RUN_DEADLINE(
            f"The {stage} stage did not finish before the run's deadline on ranks {format_ranks(stuck)}{doing}",
            detail=f"The watchdog ended the run {self.config.timeout:g}s after distdoctor started, "
            f"in the {stage} stage{during}; the report is partial.",
            ranks=stuck, check="watchdog", data=data,
        )

    def _testing_hang(self, stage: str) -> None:
        """Test-only: DISTDOCTOR_TESTING=1 DISTDOCTOR_TEST_HANG=<rank>:<stage> blocks this flow.

        It stands for a hang no deadline can interrupt (a C++ wait), to prove the watchdog ends
        the run; it is ignored unless DISTDOCTOR_TESTING=1.
        """
        env = self.ctx.env
        if env.get("DISTDOCTOR_TESTING") != "1":
            return
        want = env.get("DISTDOCTOR_TEST_HANG", "")
        if want == f"{self.rank}:{stage}":
            self._enter_stage("collective" if stage == "gather" else stage)
            mark = env.get("DISTDOCTOR_TEST_HANG_FILE")
            if mark:  # tells a test that the hang has begun (it then sends a signal, say)
                with open(mark, "w") as fh:
                    fh.write(str(os.getpid()))
            while True:
                time.sleep(3600)


def pointer_line(rank: int, size: int | None, host: str, report: Report) -> str:
    """The one line a rank other than 0 prints: what stopped it, and where the report is."""
    of = f" of {size}" if size is not None else ""
    worst = max(report.findings, key=lambda f: f.severity, default=None)
    if worst is None or worst.severity < Severity.WARNING:
        why = "its run ended without a word from rank 0" if report.incomplete else "finished"
    else:
        why = f"{worst.id}: {worst.title}"
    return (f"distdoctor: rank {rank}{of} on {host}: {why}. Only rank 0 prints a report "
            "(--all-ranks: every rank).")


def run_rank(config: Config, **kwargs: Any) -> RankOutcome:
    """Run every selected stage as one rank of the world the environment describes."""
    return RankRun(config, **kwargs).run()


def group_blockers(checkins: CheckIns) -> dict[str, list[str]]:
    """backend -> the ranks whose own local findings show they cannot create that backend's group.

    Only facts that make the creation fail for certain count: *_SOCKET_IFNAME naming an interface
    that does not exist on the rank's host (gloo stops with "Unable to find address for: X"; NCCL
    finds "no socket interface"), the backend not built in. A down interface or one without an
    address is left to the collective stage itself (a rank whose group fails tells the others
    through the store at once).
    """
    out: dict[str, list[str]] = {"gloo": [], "nccl": []}
    for rank, payload in sorted(checkins.accepted.items()):
        if not 0 <= rank < checkins.expected:
            continue
        host = payload.get("host")
        for raw in payload.get("findings") or ():
            if not isinstance(raw, Mapping):
                continue
            try:
                severe = Severity.parse(raw.get("severity", "info")) >= Severity.ERROR
            except (KeyError, ValueError):
                continue
            if not severe:
                continue
            try:
                blocked = _backends_blocked(raw)
            except (TypeError, AttributeError):
                continue  # a finding of a shape no distdoctor writes: not evidence of anything
            for backend in blocked:
                out[backend].append(f"rank {rank}{f' on {host}' if host else ''}: {raw.get('title')} ({raw.get('id')})")
    return out


def _backends_blocked(finding: Mapping[str, Any]) -> tuple[str, ...]:
    data = finding.get("data") if isinstance(finding.get("data"), Mapping) else {}
    cause = finding.get("cause")
    if cause == "wrong_interface":
        existing = data.get("interfaces")
        if not isinstance(existing, list):
            return ()
        if data.get("variable") == "GLOO_SOCKET_IFNAME":
            unusable = data.get("unusable") or []
            return ("gloo",) if any(name not in existing for name in unusable) else ()
        if data.get("variable") == "NCCL_SOCKET_IFNAME" and data.get("matched") == []:
            return ("nccl",)
        return ()
    if cause == "backend_unavailable":
        backend = data.get("backend")
        if backend in ("gloo", "nccl"):
            return (backend,)
        return ("gloo", "nccl") if "backend" not in data and "reason" not in data else ()
    return ()


def nccl_decision(checkins: CheckIns, config: Config, blockers: Sequence[str] = ()) -> dict[str, Any]:
    """Whether every rank runs the nccl collectives (all must agree, or the group would hang)."""
    if config.backend not in (None, "nccl"):
        return {"nccl": False, "nccl_reason": f"skipped: the configured backend is {config.backend}"}
    accepted = {r: p for r, p in checkins.accepted.items() if 0 <= r < checkins.expected}
    if not accepted or checkins.missing:
        return {"nccl": False, "nccl_reason": "skipped: not every rank checked in"}
    if blockers:
        return {"nccl": False, "nccl_reason": "skipped: the nccl group cannot form: " + "; ".join(blockers)}
    without_gpu = sorted(r for r, p in accepted.items() if not isinstance(p.get("device"), dict))
    backends = {r: ((p.get("snapshot") or {}).get("torch") or {}) for r, p in accepted.items()}
    without_nccl = sorted(
        r for r, info in backends.items()
        if not (isinstance(info, dict) and (info.get("backends") or {}).get("nccl"))
    )
    if without_gpu or without_nccl:
        reasons = []
        if without_gpu:
            reasons.append(f"{_ranks(without_gpu)} {'has' if len(without_gpu) == 1 else 'have'} no GPU")
        if without_nccl:
            reasons.append(f"{_ranks(without_nccl)} {'has' if len(without_nccl) == 1 else 'have'} no nccl")
        return {"nccl": False, "nccl_reason": "skipped: " + " and ".join(reasons)}
    devices = {str(r): int(p["device"].get("index", 0)) for r, p in accepted.items()}
    return {"nccl": True, "devices": devices}


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + format_ranks(ranks)
