"""One rank of `distdoctor bench`: join the world, measure, hand the figures to rank 0, one report.

The world is the one `distdoctor check` uses (distdoctor.world): the same store, the same
check-in, the same process-group creation with its failure signalling. The flow:

1. every rank checks in (host, endpoint address, GPU); rank 0 waits for all of them, then
   publishes the decision: the backend, rank 0's plan, every rank's host and endpoint;
2. every rank creates the group, looks up its routes to the other hosts, runs the link
   matrix, then the sweep, and posts its figures;
3. rank 0 gathers, judges, renders ONE report and publishes the exit code for the others.

A watchdog holds the deadline: past it rank 0 renders what it measured itself (partial) and
every rank exits with code 3; a rank that cannot reach rank 0 reports for itself.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from distdoctor.bench.assemble import assemble
from distdoctor.bench.comm import Comm
from distdoctor.bench.interfaces import SLOW_PORT_MBPS, endpoint, faster_ports, routes_to
from distdoctor.bench.kinds import NO_WORLD, RANKS_MISSING
from distdoctor.bench.link_matrix import LinkPlan, run_link_matrix
from distdoctor.bench.pairing import round_robin
from distdoctor.bench.progress import Progress
from distdoctor.bench.settings import CPU_LINK_BYTES, GPU_LINK_BYTES, BenchSettings
from distdoctor.bench.sizes import default_sizes
from distdoctor.bench.sweep import DEADLINE_STOP, SweepPlan, run_sweep
from distdoctor.core.kinds import RUN_DEADLINE
from distdoctor.core.findings import Finding
from distdoctor.machine.launchers import detect
from distdoctor.machine.probes import Probes, call_with_deadline
from distdoctor.core.report import EXIT_INCOMPLETE, Report, WorldSummary, build_report, format_ranks
from distdoctor.world.watchdog import Watchdog, flush_std_streams
from distdoctor.world.store_exchange import World, WorldError
from distdoctor.world.store_open import WorldSpec

RESULTS_LIMIT = 4 * 2**20  # figures of one rank: ~100 B per sweep row and per led link
ROOT_MARGIN_S, MEMBER_GRACE_S, EXPIRE_GRACE_S = 0.4, 0.4, 0.9
GOODBYE_S = 1.0


def work_reserve(timeout: float) -> float:
    """Time kept back from the deadline for gathering the figures and rendering the report."""
    return min(max(0.1 * timeout, 0.5), 3.0)


@dataclass
class BenchOutcome:
    report: Report | None
    exit_code: int
    world_opened: bool = False
    world_described: bool = True


class BenchRank:
    def __init__(self, settings: BenchSettings, *, env: Mapping[str, str], argv: Sequence[str],
                 emit: Callable[[Report], None] | None, started: float, clock: Callable[[], float] = time.monotonic,
                 exit: Callable[[int], None] = os._exit) -> None:
        self.settings = settings
        self.env = dict(env)
        self.emit = emit
        self.clock = clock
        self.exit = exit
        self.started = started
        self.deadline = started + settings.timeout
        self.work_deadline = self.deadline - work_reserve(settings.timeout)
        self.launch = detect(self.env, argv)
        self.probes = Probes()
        self.world: World | None = None
        self.rank = self.launch.rank.value or 0
        self.hosts: dict[int, str] = {}
        self.backend = settings.backend or "gloo"
        self.own: dict[str, Any] = {"sweep": [], "links": [], "routes": {}, "stopped": None}
        self.stage = "rendezvous"
        self._reported_code: int | None = None
        self._emit_lock = threading.Lock()
        self._progress: Progress | None = None
        self._early_code = EXIT_INCOMPLETE
        self.durations: dict[str, float] = {}

    # -- reporting -------------------------------------------------------------------------
    def _report(self, findings: Sequence[Finding], *, data: dict[str, Any] | None = None, incomplete: bool = False,
                reported: Sequence[int] = (), missing: Sequence[int] = (), checks: Sequence[Mapping[str, Any]] = ()) -> Report:
        size = self.launch.world_size.value
        report = build_report(findings, checks, world=WorldSummary(size, self.launch.launcher, tuple(reported), tuple(missing)),
                              duration_s=self.clock() - self.started, incomplete=incomplete, silence=self.settings.silence)
        if data is not None:
            report.data = {"bench": data}
        return report

    def _emit(self, report: Report, code: int | None = None) -> int:
        """Render once per process; returns the code of the report that was rendered.

        The main flow and the watchdog race near the deadline: the lock is held for the whole
        rendering, so the loser waits until the winner's report is out (and exits with its
        code) instead of ending the process in the middle of it.
        """
        with self._emit_lock:
            if self._reported_code is not None:
                return self._reported_code
            self._reported_code = report.exit_code(self.settings.fail_level) if code is None else code
            if self._progress is not None:
                self._progress.close()
            if self.emit is not None:
                self.emit(report)
                flush_std_streams()
            return self._reported_code

    def _alone(self, finding: Finding, incomplete: bool = False) -> BenchOutcome:
        report = self._report([finding], reported=(self.rank,), incomplete=incomplete)
        return BenchOutcome(report, self._emit(report), self.world is not None)

    # -- the flow --------------------------------------------------------------------------
    def run(self) -> BenchOutcome:
        spec = WorldSpec.from_launch(self.launch, self.env)
        if spec is None:
            return self._alone(NO_WORLD(detail="The environment does not describe a usable world (RANK, WORLD_SIZE, "
                                        "MASTER_ADDR, MASTER_PORT)."))
        root = spec.rank == 0
        watchdog = Watchdog(self.deadline + (-ROOT_MARGIN_S if root else MEMBER_GRACE_S), self._on_deadline,
                            clock=self.clock, exit=self.exit, grace_s=EXPIRE_GRACE_S)
        watchdog.start()
        try:
            import torch.distributed  # noqa: F401  (seconds on a busy node: before the world's deadlines)

            try:
                self.world = World.open(spec, self.work_deadline, self.clock, self.probes)
            except WorldError as exc:
                # No time was left to try (starting Python and torch took the deadline): a cut-off
                # run, not a broken world. A store that never answered is a finding (exit 1).
                late = exc.reason == "no_time"
                return self._alone(NO_WORLD(detail=str(exc), ranks=(spec.rank,), data={"reason": exc.reason, "cause": exc.cause}),
                                   incomplete=late)
            if self.world.check_in(self._checkin()) > 1:
                return self._alone(NO_WORLD(f"Another process already claimed rank {spec.rank}", ranks=(spec.rank,),
                                            detail="Two processes were started with the same rank; this one stays out."))
            decision = self._decide() if root else self._await_decision()
            if decision is None:
                return self._finish_member() if not root else BenchOutcome(None, self._early_code, True)
            self._measure(decision)
            return self._gather(decision) if root else self._finish_member()
        finally:
            watchdog.cancel()

    def _checkin(self) -> dict[str, Any]:
        import torch  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

        local = self.launch.local_rank.value or 0
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        # Rank 0 picks the backend only once everyone checked in: offer the endpoint of each candidate.
        candidates = (self.settings.backend,) if self.settings.backend else (("gloo", "nccl") if gpus else ("gloo",))
        return {"host": socket.gethostname(), "pid": os.getpid(), "gpus": gpus, "local_rank": local,
                "nccl": bool(torch.distributed.is_nccl_available()),
                "endpoints": {b: endpoint(b, self.env, self.probes) for b in candidates}}

    def _decide(self) -> dict[str, Any] | None:
        world = self.world
        assert world is not None
        checkins = world.wait_for_checkins(self.work_deadline, settle_s=0.05)
        accepted = {r: p for r, p in checkins.accepted.items() if 0 <= r < world.size}
        self.hosts = {r: str(p.get("host", "?")) for r, p in accepted.items()}
        if checkins.missing:
            world.put("decision", {"skip": f"ranks {format_ranks(checkins.missing)} never checked in"})
            report = self._report([RANKS_MISSING(
                f"Ranks {format_ranks(checkins.missing)} never joined the bench",
                detail=f"{len(accepted)} of {world.size} ranks checked in within {checkins.waited_s:.1f}s.",
                ranks=checkins.missing)], reported=sorted(accepted), missing=checkins.missing)
            self._early_code = self._emit(report)
            self._publish_final(self._early_code, len(accepted) - 1)
            return None
        backend = self.settings.backend
        if backend is None:
            ok = all(p.get("nccl") and int(p.get("gpus") or 0) > int(p.get("local_rank") or 0) for p in accepted.values())
            backend = "nccl" if ok else "gloo"
        endpoints = {self.hosts[r]: ((p.get("endpoints") or {}).get(backend) or {}).get("address")
                     for r, p in sorted(accepted.items())}
        decision = {"backend": backend, "plan": self.settings.plan(), "hosts": {str(r): h for r, h in self.hosts.items()},
                    "endpoints": endpoints}
        world.put("decision", decision)
        return decision

    def _await_decision(self) -> dict[str, Any] | None:
        world = self.world
        assert world is not None
        _, decision = world.fetch_first(("decision",), self.deadline)
        if not isinstance(decision, dict) or decision.get("skip"):
            return None
        self.hosts = {int(r): str(h) for r, h in decision["hosts"].items()}
        return decision

    def _measure(self, decision: Mapping[str, Any]) -> None:
        world = self.world
        assert world is not None
        self.backend = str(decision["backend"])
        plan = decision["plan"]
        size = world.size
        on_gpu = self.backend == "nccl"
        sizes = tuple(plan["sizes"] or default_sizes(on_gpu))
        rounds = len(round_robin(size)) if plan["links"] else 0
        if world.rank == 0:
            self._progress = Progress(rounds + len(plan["ops"]) * len(sizes), self.settings.progress)
        step = self._progress.step if self._progress is not None else (lambda _p: (lambda _w: None))
        host = self.hosts.get(world.rank)
        peers = {h: a for h, a in (decision.get("endpoints") or {}).items() if h != host}
        self.own["routes"] = {"routes": routes_to(peers, self.probes)}
        if any((r.get("speed_mbps") or 10**9) <= SLOW_PORT_MBPS for r in self.own["routes"]["routes"].values()):
            self.own["routes"]["faster"] = faster_ports(self.probes, SLOW_PORT_MBPS)
        self.stage = "group"
        try:
            comm = self._comm(world, on_gpu)
        except Exception as exc:
            self.own["stopped"] = f"the {self.backend} group could not be created: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
            return
        link_bytes = int(plan.get("link_bytes") or (GPU_LINK_BYTES if on_gpu else CPU_LINK_BYTES))
        if plan["links"]:
            self.stage = "link matrix"
            began = self.clock()
            links_deadline = began + 0.5 * max(self.work_deadline - began, 0.0)
            self.own["links"], stopped = run_link_matrix(comm, LinkPlan(link_bytes, links_deadline), step("links"), self.clock)
            self.durations["link_matrix"] = self.clock() - began
            if stopped:
                self.own["stopped"] = stopped
                return
        self.stage = "sweep"
        sweep_plan = SweepPlan(tuple(plan["ops"]), sizes, int(plan["iters"]), int(plan["warmup"]), self.work_deadline)
        began = self.clock()
        self.own["sweep"], self.own["stopped"], self.own["unsupported"] = run_sweep(comm, sweep_plan, step("sweep"))
        self.durations["sweep"] = self.clock() - began

    def _comm(self, world: World, on_gpu: bool) -> Comm:
        import torch  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap
        import torch.distributed as dist  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

        device = torch.device("cpu")
        if on_gpu:
            device = torch.device("cuda", (self.launch.local_rank.value or 0) % max(torch.cuda.device_count(), 1))
            torch.cuda.set_device(device)
        group = world.process_group(self.backend, max(self.work_deadline - self.clock(), 1.0))
        return Comm(dist, torch, group, device, world.rank, world.size, self.backend)

    # -- gathering -------------------------------------------------------------------------
    def _post(self) -> None:
        world = self.world
        assert world is not None
        world.mark_done("bench", self.own, limit=RESULTS_LIMIT)

    def _gather(self, decision: Mapping[str, Any]) -> BenchOutcome:
        world = self.world
        assert world is not None
        self.stage = "gather"
        others = [r for r in range(world.size) if r != 0]
        done = world.wait_done("bench", others, self.deadline - ROOT_MARGIN_S - 0.3) | {0}
        results = {0: self.own}
        for rank in sorted(done - {0}):
            value = world.fetch(f"results/bench/{rank}", self.clock() + 0.5, limit=RESULTS_LIMIT)
            if isinstance(value, dict):
                results[rank] = value
        stopped = {r: str(v["stopped"]) for r, v in results.items() if v.get("stopped")}
        stopped.update({r: "did not hand in its figures before the deadline" for r in range(world.size) if r not in results})
        # Stopped by the deadline (every rank at the same point) is a partial report, exit 3.
        cut = any(why.startswith(DEADLINE_STOP) for why in stopped.values())
        report = self._full_report(results, stopped, str(decision["backend"]), incomplete=cut)
        code = self._emit(report)
        self._publish_final(code, world.size - 1)
        return BenchOutcome(report, code, True)

    def _full_report(self, results: Mapping[int, Mapping[str, Any]], stopped: Mapping[int, str], backend: str,
                     extra: Sequence[Finding] = (), incomplete: bool = False) -> Report:
        world = self.world
        size = world.size if world is not None else 1
        bench, findings = assemble(
            size=size, hosts=self.hosts, sweeps={r: v.get("sweep") or [] for r, v in results.items()},
            links=[l for v in results.values() for l in v.get("links") or []],
            routes={r: v.get("routes") or {} for r, v in results.items()}, stopped=stopped, backend=backend,
            unsupported={str(op): str(why) for v in results.values() if isinstance(v.get("unsupported"), dict)
                         for op, why in v["unsupported"].items()},
            baseline=self.settings.baseline, tolerance=self.settings.tolerance,
            measured_links="link_matrix" not in self._skipped())
        return self._report([*findings, *extra], data=bench, incomplete=incomplete, reported=sorted(results),
                            missing=sorted(set(range(size)) - set(results)), checks=self._checks(stopped))

    def _skipped(self) -> set[str]:
        return set() if self.settings.links else {"link_matrix"}

    def _checks(self, stopped: Mapping[int, str]) -> list[dict[str, Any]]:
        """The two phases as check entries (status, rank 0's time), for the summary line."""
        ranks = sorted(self.hosts) or [self.rank]
        out = []
        for name in ("link_matrix", "sweep"):
            if name == "link_matrix" and not self.settings.links:
                out.append({"name": f"bench.{name}", "stage": "bench", "status": "skip", "duration_s": 0.0,
                            "ranks": ranks, "reason": "skipped: --no-links"})
                continue
            ran = name in self.durations
            status = "pass" if ran and not stopped else ("timeout" if stopped else "skip")
            out.append({"name": f"bench.{name}", "stage": "bench", "status": status,
                        "duration_s": round(self.durations.get(name, 0.0), 4), "ranks": ranks})
        return out

    def _publish_final(self, code: int, others: int) -> None:
        world = self.world
        assert world is not None
        try:
            world.put("final", {"exit": code})
            if world.hosted and others > 0:
                world.await_goodbyes(others, min(self.clock() + GOODBYE_S, self.deadline))
        except Exception:
            pass
        world.close(destroy_groups=False)

    def _finish_member(self) -> BenchOutcome:
        world = self.world
        assert world is not None
        try:
            self._post()
        except Exception as exc:
            world.lost = f"the store went away: {exc}"
        _, final = world.fetch_first(("final",), self.deadline + MEMBER_GRACE_S)
        try:
            world.say_goodbye()
        except Exception:
            pass
        if isinstance(final, dict) and isinstance(final.get("exit"), int):
            return BenchOutcome(None, int(final["exit"]), True)
        why = world.lost or "rank 0 published no report before this rank's deadline"
        report = self._full_report({self.rank: self.own}, {self.rank: why}, self.backend, incomplete=True)
        return BenchOutcome(report, self._emit(report), True)

    # -- the deadline ----------------------------------------------------------------------
    def _on_deadline(self) -> int | None:
        """Watchdog thread: rank 0 renders what it measured itself; the others stay quiet when
        rank 0 left its final word, and otherwise render their own (nobody else will)."""
        with self._emit_lock:  # a report being rendered right now is finished first
            rendered = self._reported_code
        if rendered is not None:
            return rendered
        if self.rank != 0:
            return self._member_on_deadline()
        deadline = RUN_DEADLINE(f"The bench did not finish before its deadline (in the {self.stage} stage)",
                                detail=f"The watchdog ended the run {self.settings.timeout:g}s after it started; "
                                "the figures are rank 0's own and partial.", ranks=(0,), check="watchdog",
                                data={"stage": self.stage})
        stopped = {0: f"the deadline came during the {self.stage} stage"}
        report = self._full_report({0: self.own}, stopped, self.backend, extra=[deadline], incomplete=True)
        code = self._emit(report, EXIT_INCOMPLETE)
        if code != EXIT_INCOMPLETE:
            return code  # the main flow's full report got out first
        world = self.world
        if world is not None:
            call_with_deadline(lambda: world.put("final", {"exit": EXIT_INCOMPLETE}), 0.25, "final")
        return None


    def _member_on_deadline(self) -> int | None:
        world = self.world
        if world is not None:
            got = call_with_deadline(lambda: world.fetch_first(("final",), self.clock() + 0.25), 0.35, "final")
            if isinstance(got, tuple) and isinstance(got[1], dict):
                return None  # rank 0 reported for the world
        deadline = RUN_DEADLINE(
            f"The bench did not finish before its deadline on rank {self.rank} (in the {self.stage} stage)",
            detail=f"The watchdog ended the run {self.settings.timeout:g}s after it started. Rank 0 left no final "
            "word in the store (it is gone or stuck), so this rank reports its own figures, partial.",
            ranks=tuple(sorted({0, self.rank})), check="watchdog", data={"stage": self.stage, "rank0_final_word": False})
        stopped = {self.rank: f"the deadline came during the {self.stage} stage"}
        report = self._full_report({self.rank: self.own}, stopped, self.backend, extra=[deadline], incomplete=True)
        return self._emit(report, EXIT_INCOMPLETE)


def run_bench_rank(settings: BenchSettings, *, env: Mapping[str, str], argv: Sequence[str],
                   emit: Callable[[Report], None] | None, started: float, all_ranks: bool = False, **_: Any) -> BenchOutcome:
    """The bench's per-rank body, for the CLI under a launcher and for the self-test world."""
    return BenchRank(settings, env=env, argv=argv, emit=emit, started=started).run()
