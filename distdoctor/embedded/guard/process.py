"""The Guard of one process: torch's functions wrapped, the calls run through the recorder and verifier."""

from __future__ import annotations

import atexit
import functools
import os
import sys
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from distdoctor.diagnosis.snapshot import FINISHED, RUNNING, RankSnapshot
from distdoctor.world.store_wire import store_gone
from distdoctor.embedded.guard import evidence, pace, transport
from distdoctor.embedded.guard import findings as gf
from distdoctor.embedded.guard import report as api
from distdoctor.embedded.guard import snapshot as snapshots
from distdoctor.embedded.guard.calls import Verifier, make_record, peer_rank, run_call, wrap
from distdoctor.embedded.guard.crash import CrashHook
from distdoctor.embedded.guard.flight import FlightRecorder
from distdoctor.embedded.guard.channel import SideChannel
from distdoctor.embedded.guard.watch import EpisodeWatch
from distdoctor.embedded.guard.record import (_COLLECTIVE_SET, COLLECTIVES, POINT_TO_POINT, CallRecord, Recorder,
                                              call_site)
from distdoctor.embedded.guard.sample import Sampler, verification_cost
from distdoctor.embedded.guard import episodes, policy
from distdoctor.embedded.guard.verdict import decide
from distdoctor.embedded.guard.works import WorkTracker, batch_parts, published
from distdoctor.core.findings import Finding
from distdoctor.core.report import Report, WorldSummary, build_report
from distdoctor.machine.launchers import detect

# At the rank's end, how long it waits for the watchdog's poll in progress to end (a store request of
# its own is bounded by the channel's timeout): past that, what the poll was doing is dropped, and said.
STOP_WAIT_S = 1.0
EXIT_PAUSE_S = 0.2   # at interpreter exit, the GIL left free for torch's gloo threads (_at_exit)


class Guard:
    def __init__(self, settings: Any) -> None:
        import torch  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap
        import torch.distributed as dist  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

        self.settings, self.torch, self.dist = settings, torch, dist
        self.c10d = dist.distributed_c10d
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.recorder = Recorder(settings.ring_size)
        self.sampler = Sampler(settings.verify, settings.verify_first, settings.verify_budget, settings.verify_every)
        self.last_verified: dict[str, CallRecord] = {}  # group -> its last verified call (what verifying costs)
        self.findings: list[Finding] = []
        self.dropped: deque[CallRecord] = deque(maxlen=16)  # the latest dropped Works (a look's answer carries them)
        self.phase = "running"
        self.originals: dict[str, Callable[..., Any]] = {}
        self.wrapped: dict[str, Callable[..., Any]] = {}
        self.groups: dict[int, tuple[str, list[int]]] = {}
        self.world_group: tuple | None = None  # _group(None) while the default group stands
        self.verifier: Verifier | None = None
        self.works = WorkTracker(self.c10d.Work, self._dropped, self._waiting)
        self.watch: EpisodeWatch | None = None
        self.meter: Any = None  # the slow-rank accounting (embedded.guard.pace), when on
        self.side_problem = ""
        self.flight = FlightRecorder(self.c10d_module(), os.environ, os.environ.get("DISTDOCTOR_GUARD_FR_NOTE", ""))
        self.crash = CrashHook(self)
        self.final_left = False
        self.concluded = False
        self.shut_down = False
        self.faults: dict[tuple[str, str], int] = {}
        self.started = time.monotonic()

    def c10d_module(self) -> Any:
        return getattr(self.torch._C, "_distributed_c10d", None)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, generation: int) -> "Guard":
        for name in COLLECTIVES + POINT_TO_POINT + ("destroy_process_group",):
            current = getattr(self.c10d, name, None)
            if current is None:
                continue
            original = getattr(current, "__distdoctor_original__", current)
            self.originals[name] = original
            wrapped = self._destroy_wrapper(original) if name == "destroy_process_group" else wrap(name, original, self)
            self.wrapped[name] = wrapped
            for module in (self.c10d, self.dist):
                if getattr(module, name, None) is current:
                    setattr(module, name, wrapped)
        self.verifier = Verifier(self.torch, self.dist, self.originals["all_gather"])
        self.works.install()
        side = self._side_channel(generation)
        s = self.settings
        self.watch = EpisodeWatch(self, self.recorder, side, hang_timeout=s.hang_timeout, answer_s=s.answer_s,
                                  poll_s=s.poll_s, on_hang=s.on_hang, flight=self.flight, world=self.world)
        self.watch.start()
        self._pace("start")
        self.crash.install()
        atexit.register(self._at_exit)
        blind = self.blind_spots()
        if blind is not None and self.rank == 0:
            sys.stderr.write(f"distdoctor guard (rank 0): {blind.id} [{blind.cause}] {blind.title}\n")
        return self

    def _side_channel(self, generation: int) -> SideChannel | None:
        """The job's side channel (its client opened when first needed) with this rank's hello in it:
        host, boot id, PID namespace, pid and start, through torch's own client (no connection yet)."""
        from distdoctor.machine.proc_stat import identity  # read once, at the start

        try:
            side = SideChannel.open(self.c10d._get_default_store(), generation)
            if side is None:
                self.side_problem = "the job's store is not a TCPStore"
                return None
            side.hello(self.rank, identity())
            return side
        except Exception as exc:  # no side channel: hangs are still reported, from this rank's view
            self.side_problem = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            return None

    def cross_rank_problem(self) -> str:
        """Why this rank has no cross-rank view ('' while it has one or may still get one)."""
        side = self.watch.side if self.watch is not None else None
        if not self.side_problem and side is not None and side.gave_up:
            return f"its store client could not be opened: {side.problem}"
        return self.side_problem

    def blind_spots(self) -> Finding | None:
        """guard.I011: what this guard cannot count or see, and why (None: it sees the whole job)."""
        parts = []
        if not self.flight.usable:
            parts.append(f"collectives issued in C++ (DDP, FSDP) are not counted: {self.flight.problem}; a wait in "
                         "one is told from each rank's main-thread stack, without sequence numbers")
        if self.cross_rank_problem():
            parts.append(f"no cross-rank view, each rank reports from its own ({self.cross_rank_problem()})")
        if not parts:
            return None
        return gf.BLIND("The guard sees only part of the job: " + "; ".join(parts), ranks=[self.rank], check=gf.CHECK)

    def apply(self, settings: Any) -> None:
        """guard() called again: the new settings, for the watchdog too."""
        self.settings = settings
        if self.watch is not None:
            self.watch.hang_timeout, self.watch.on_hang = settings.hang_timeout, settings.on_hang

    def stop(self) -> None:
        for name, wrapped in self.wrapped.items():
            for module in (self.c10d, self.dist):
                if getattr(module, name, None) is wrapped:
                    setattr(module, name, self.originals[name])
        self.works.uninstall()
        self.crash.uninstall()
        self._pace("stop")
        if self.watch is not None:
            self.watch.stop(join_s=1.0)
        atexit.unregister(self._at_exit)

    def _destroy_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def destroy_process_group(group: Any = None) -> Any:
            self.world_group = None
            if group is None:
                self.shutdown("destroyed")
            return original(group)
        destroy_process_group.__distdoctor_original__ = original  # type: ignore[attr-defined]
        return destroy_process_group

    def _at_exit(self) -> None:
        self.shutdown("finished")
        # Then a moment with the GIL free before the interpreter finalizes: torch's gloo worker thread frees a
        # collective's work after the call returned, and the work's thread-local state holds a Python object,
        # so the thread then waits for the GIL; once the interpreter is finalizing, Python ends that thread
        # inside C++ code and the process aborts ("terminate called without an active exception", exit -6, after
        # a script that ended well: ProcessGroupGloo::runLoop -> ~AsyncWork -> ~ThreadLocalState -> take_gil ->
        # pthread_exit -> std::terminate, read with gdb). docs/guard.md says what it was measured to do.
        time.sleep(EXIT_PAUSE_S)

    def shutdown(self, phase: str) -> None:
        """At destroy_process_group / exit: report Works never waited on, leave a final state."""
        if self.shut_down:
            return
        self.shut_down, self.phase, self.world_group = True, phase, None
        where = "destroy_process_group" if phase == "destroyed" else "exit"
        for record in self.works.pending():
            self.findings.append(gf.work_finding(gf.PENDING, record, self.rank, f"never waited on, still pending at {where}"))
        # No thread of the guard's is inside torch's C++ code from here on, by construction: the store
        # client is plain Python (world.store_wire) and the recorder's gate is closed to every thread but
        # this one (a read in progress ends first: it does no I/O). The interpreter may then finalize
        # around the guard's threads at any moment without aborting the process.
        self.flight.close()
        if self.watch is not None:
            self.watch.stop(join_s=STOP_WAIT_S)
            if self.watch.busy():
                self.note(f"this rank ended while its watchdog was {self.watch.busy()}: that is dropped")
            self.watch.finish()
            if not self.final_left or self.crash.withdrawn():  # withdrawn: a failed call's error was caught
                self.leave_final(self.state(FINISHED, keep=False))
            self.stall_summary(wait_s=self.settings.answer_s)
            self._pace("conclude")
            evidence.finish(self.settings.report_dir, self.rank, self.world, self.flight, self.watch.saw_episodes)
        if self.findings and not self.concluded:
            report = self.report()
            sys.stderr.write(api.render_text(report, f"distdoctor guard (rank {self.rank}) at {where}:") + "\n")
            self.write_json(report, "summary")

    def _pace(self, step: str) -> None:
        """The slow-rank accounting's start, stop, or end of run (embedded.guard.pace); its fault is its own."""
        try:
            if step == "start":
                self.meter = pace.start(self)
            elif self.meter is not None:
                meter, self.meter = self.meter, None
                if step == "conclude":
                    pace.conclude(self, meter)
                else:
                    meter.stop()
        except Exception as exc:
            self.fault("slow-rank accounting", exc)

    def leave_final(self, state: dict[str, Any]) -> None:
        """A rank that finishes or raises leaves its last state, so a peer still waiting can say so."""
        self.final_left = True
        if self.watch is not None:
            problem = self.watch.publish("final", {**state, "final": True})
            status = state.get("snapshot", {}).get("status")
            # A rank that finished while the store's host had already ended (every rank done, rank 0 first):
            # no peer can wait on a store that is gone, so there is nothing to say.
            if problem and not (status == FINISHED and store_gone(self.watch.channel_error)):
                self.note(f"its final state ({state.get('snapshot', {}).get('status', '?')}) was not left in the "
                          f"job's store ({problem}): a peer still waiting will not read it")

    # -- the guarded call --------------------------------------------------------------------
    def group_ranks(self, name: str) -> list[int]:
        for group_name, ranks in self.groups.values():
            if group_name == name:
                return ranks
        try:  # a group only C++ used (the recorder's id is the group's name)
            for pg, pg_name in list(self.c10d._world.pg_names.items()):
                if str(pg_name) == name:
                    return list(self.dist.get_process_group_ranks(pg))
        except Exception:  # private API: the whole world is the safe answer
            pass
        return list(range(self.world))

    def pg_name(self, pg: Any) -> str:
        """A process group's name as torch's flight recorder and the diagnosis know it ("0": the default
        group): ProcessGroup.group_name, else c10d's own table of names (torch 2.1 has no group_name)."""
        name = getattr(pg, "group_name", "")
        if not name:
            try:
                name = self.c10d._world.pg_names.get(pg, "")
            except Exception:  # private API: the object's id names it for this process
                name = ""
        return str(name or id(pg))

    def wait_group(self, pg: Any) -> str:
        """The group a wait the main thread's stack shows is in: the DDP model's, else the default group."""
        known = self._group(pg) if pg is not None else None
        return known[1] if known is not None else self.pg_name(self.c10d.GroupMember.WORLD)

    def _group(self, group: Any) -> tuple[Any, str, list[int], Callable[[dict, str], Any]] | None:
        """(the process group, its name, its global ranks, its src/dst resolver), kept per group."""
        if group is None and self.world_group is not None:  # the usual call: the default group, known
            return self.world_group
        pg = group if group is not None else self.c10d.GroupMember.WORLD
        if pg is None or pg is self.c10d.GroupMember.NON_GROUP_MEMBER:
            return None
        known = self.groups.get(id(pg))
        if known is None:
            known = self.groups[id(pg)] = (self.pg_name(pg), list(self.dist.get_process_group_ranks(pg)))
        # The resolver is made once per group, not per call (the hot path).
        found = (pg, known[0], known[1], functools.partial(peer_rank, self.dist, group))
        if group is None and not self.shut_down:  # forgotten at any destroy_process_group
            self.world_group = found
        return found

    def call(self, name: str, original: Callable[..., Any], args: tuple, kwargs: dict, bound: dict,
             takes_async: bool, frame: Any = None) -> Any:
        group = bound.get("group")
        if name == "batch_isend_irecv":
            ops = list(bound.get("p2p_op_list") or ())
            group = getattr(ops[0], "group", None) if ops else None
        found = self._group(group)
        if found is None:
            return original(*args, **kwargs)
        pg, group_name, ranks, peer = found
        record = make_record(name, bound, group_name, peer, frame)
        recorder = self.recorder
        collective = name in _COLLECTIVE_SET
        if collective:
            token = recorder.begin_collective(record)
        else:
            record.seq = recorder.next_p2p_seq(group_name, name, record.params.get("peer"), record.params.get("tag", 0))
            token = recorder.begin(record)
            parts = batch_parts(record, ops, recorder) if name == "batch_isend_irecv" else None
        try:
            if collective and self.sampler.due(group_name, record.seq, record.started):
                record.verified = True
                self._verify(record, pg, ranks)
            result, work = run_call(original, args, kwargs, bound, record, takes_async and collective)
        except BaseException as exc:
            recorder.end(token, failed=True)
            explained = self._explain_failure(record, ranks, exc)
            if explained is not None:
                raise explained from exc
            raise
        if work is not None:
            recorder.attach(token, work)
        else:
            recorder.end(token)
        if name in ("isend", "irecv"):
            self.works.track(result, record)
        elif name == "batch_isend_irecv":
            works = list(result or ())
            # One Work per op (gloo): each is its op's; one for the whole batch: the batch's.
            for item, part in zip(works, parts if parts and len(parts) == len(works) else [record] * len(works)):
                self.works.track(item, part)
        return result

    def _verify(self, record: CallRecord, pg: Any, ranks: list[int]) -> None:
        assert self.verifier is not None
        started = time.monotonic()
        agreed, gaps = self.verifier.agree(record, pg, len(ranks), self.sampler.proposal(record.group))
        if agreed:
            last, self.last_verified[record.group] = self.last_verified.get(record.group), record
            cost = verification_cost(last, self.recorder.recent(record.group, 64), time.monotonic() - started)
            self.sampler.agreed(record.group, record.seq, gaps, cost)
            return
        recent = [r.site for r in self.recorder.recent(record.group, 9)][:-1]
        details = self.verifier.details(record, recent, pg, len(ranks))
        calls = {ranks[i]: call for i, (call, _) in enumerate(details)}
        recents = {ranks[i]: sites for i, (_, sites) in enumerate(details)}
        findings = gf.mismatch_findings(calls, recents, record.group, ranks, record.seq)
        report = self.report(findings, ranks=ranks)
        if self.rank == ranks[0]:
            self.write_json(report, "mismatch")
        raise api.GuardError(report)

    def _explain_failure(self, record: CallRecord, ranks: list[int], exc: BaseException) -> Exception | None:
        """A call torch failed (a peer closed its connection): why, from the peers' final states.

        A rank that raised, or left its loop and exited, makes gloo fail the others' next
        collective with "Connection closed by peer"; its final state in the store says which.
        """
        if isinstance(exc, api.GuardError) or not snapshots.is_consequence(exc):
            return None
        # The traceback starts in this wrapper: the stack above it holds the user's line.
        findings = self.crash.verdict(exc, exc.__traceback__, ranks, call=record)
        if not findings:
            return None
        heading = f"distdoctor guard: {record.label()} failed on rank {self.rank} ({type(exc).__name__}); the cause:"
        return api.GuardError(self.report(findings, ranks=ranks), heading)

    # -- point-to-point hygiene ----------------------------------------------------------------
    def _dropped(self, record: CallRecord) -> None:
        finding = gf.work_finding(gf.DROPPED, record, self.rank, "the Work was dropped without wait()")
        self.findings.append(finding)
        self.dropped.append(record)
        try:
            sys.stderr.write(f"distdoctor guard (rank {self.rank}): {finding.id} [{finding.cause}] {finding.title}\n")
        except Exception:
            pass

    def _waiting(self, record: CallRecord) -> Callable[[bool], None]:
        site, function = call_site(1)
        waiting = record.copy(params={**record.params, "issued_at": record.site}, ended=None, site=site, function=function)
        token = self.recorder.begin(waiting)
        return lambda failed: self.recorder.end(token, failed)

    # -- reports -----------------------------------------------------------------------------
    def snapshot(self, status: str = RUNNING, group: str | None = None, **given: Any) -> RankSnapshot:
        groups = {name: ranks for name, ranks in self.groups.values()}
        blind = self.blind_spots()
        snap = snapshots.build(rank=self.rank, status=status, recorder=self.recorder, groups=groups,
                               flight=self.flight, notes=[blind.title] if blind else [],
                               thread_errors=self.crash.thread_errors, main=self._main_look(),
                               backend_of=lambda name: transport.group_backend(self.dist, name), **given)
        # The stalled group's own connections (its backend, the device of the call that waits in it).
        return replace(snap, transport=transport.read_for(self.dist, group, self.recorder)) if status == RUNNING else snap

    def _main_look(self) -> RankSnapshot | None:
        """The watchdog's latest look at the main thread (made only without the recorder); a fault in
        describing it is said once and leaves the snapshot as the guard's records alone make it."""
        main = self.watch.main if self.watch is not None else None
        if main is None:
            return None
        try:
            return main.described(self.settings.poll_s)
        except Exception as exc:
            self.fault("main-thread look", exc)
            return None

    def failed_wait(self, tb: Any) -> str | None:
        """Without the recorder: the wait a peer's consequence came out of, read from its traceback
        (embedded.guard.mainthread); None when the recorder says or the frames do not."""
        if self.flight.usable or self.watch is None:
            return None
        try:
            return self.watch.main_thread().failed_in(tb)
        except Exception as exc:  # the diagnosis goes on without it
            self.fault("watchdog", exc)
            return None

    def state(self, status: str = RUNNING, keep: bool = True, group: str | None = None, **given: Any) -> dict[str, Any]:
        """What this rank publishes: its snapshot (``group``: the stalled one, whose transport it reads),
        its guarded calls still running, its dropped Works and receive counts (verdict.p2p_drops pairs
        them); with ``keep``, its evidence goes to the report directory at the same time."""
        snap = self.snapshot(status, group=group, **given).to_dict()
        if keep:
            evidence.leave(self.settings.report_dir, self.rank, snap, self.flight)
        return {"snapshot": snap, "running": [r.to_dict() for r in self.recorder.running_records()],
                "dropped": published(list(self.dropped), self.recorder.clock(),
                                     lambda name, devices: transport.group_backend(self.dist, name, devices)),
                "receives": self.recorder.receive_counts()}

    def report(self, findings: list[Finding] | None = None, ranks: list[int] | None = None,
               missing: list[int] = ()) -> Report:

        found = list(self.findings if findings is None else findings)
        reported = sorted(set(ranks if ranks is not None else [self.rank]) - set(missing))
        checks = [{"name": "guard", "stage": "collective", "status": "fail" if found else "pass",
                   "duration_s": round(time.monotonic() - self.started, 4)}]
        try:
            launcher = detect(dict(os.environ), sys.argv).launcher
        except Exception:
            launcher = "unknown"
        world = WorldSummary(size=self.world, launcher=launcher, ranks_reported=tuple(reported),
                             ranks_missing=tuple(sorted(missing)))
        return build_report(found, checks, world=world, duration_s=time.monotonic() - self.started)

    def write_json(self, report: Report, kind: str) -> Path | None:
        return evidence.write_report(self.settings.report_dir, self.rank, kind, report)

    # -- the watchdog's host (embedded.guard.watch.Host) -------------------------------------------
    def decide(self, states: dict[int, Any], ranks: list[int], waited: float, world_known: bool) -> list[Finding]:
        return decide(states, ranks, waited, world_known=world_known)

    def group_timeout(self, name: str) -> float | None:
        """The process group's own timeout (what torch ends a stuck collective at), when torch says."""
        try:
            pgs = [pg for pg, pg_name in list(self.c10d._world.pg_names.items()) if str(pg_name) == name]
        except Exception:  # private API: the default group is the best guess
            pgs = []
        return policy.group_timeout_s(pgs[0] if pgs else self.c10d.GroupMember.WORLD)

    def group_grace(self, name: str) -> float:
        """How long after the group's timeout the guard's backstop waits: its backend's (policy.grace_s)."""
        return policy.grace_s(transport.group_backend(self.dist, name))

    def say(self, line: str) -> None:
        try:
            sys.stderr.write(f"distdoctor guard (rank {self.rank}): {line}\n")
            sys.stderr.flush()
        except Exception:  # stderr closed: nothing left to tell
            pass

    def note(self, line: str) -> None:
        """What the guard dropped (a result it could not deliver), in its log: the report directory's
        distdoctor-guard-rank<N>.log when there is one, else stderr."""
        if not evidence.note(self.settings.report_dir, self.rank, line):
            self.say(line)

    def fault(self, part: str, exc: BaseException) -> None:
        """A fault of the guard's own: said once per part and kind (guard.W012); the guard stays on."""
        key = (part, type(exc).__name__)
        self.faults[key] = self.faults.get(key, 0) + 1
        if self.faults[key] > 1:
            return
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        at = f" at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}" if tb is not None else ""
        message = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        finding = gf.FAULT(f"The guard's {part} failed ({type(exc).__name__}{': ' + message if message else ''}{at}); "
                           "the guard stays on", ranks=[self.rank], check=gf.CHECK)
        self.findings.append(finding)
        self.say(f"{finding.id} [{finding.cause}] {finding.title}")

    def render(self, report: Report, heading: str) -> str:
        try:
            return api.render_text(report, heading)
        except Exception as exc:  # the renderer's own fault never hides the diagnosis
            self.fault("renderer", exc)
            lines = [heading] + [f"  {f.id} [{f.cause}] {f.title}\n    " + (f.detail or "").replace("\n", "\n    ")
                                 for f in report.findings]
            return "\n".join(lines)

    def show(self, findings: list[Finding], heading: str, ranks: list[int], decision: Any) -> Report:
        """A stall's verdict: the report on stderr and in the report directory, and what happens next
        (a watched stall is shown as a warning: embedded.guard.policy.shown)."""
        findings = policy.shown(findings, decision)
        missing = sorted({r for f in findings if f.cause == "rank_missing" for r in f.ranks})
        blind = self.blind_spots()
        report = self.report(findings + ([blind] if blind else []), ranks=ranks, missing=missing)
        note = f" (cross-rank view unavailable: {self.cross_rank_problem()})" if self.cross_rank_problem() else ""
        text = self.render(report, f"distdoctor guard (rank {self.rank}): {heading}{note}")
        verb = "the guard ends the job" if decision.action == policy.END else "the guard watches"
        try:
            sys.stderr.write(f"{text}\ndistdoctor guard (rank {self.rank}): {verb}: {decision.reason}\n")
            sys.stderr.flush()
        except Exception:
            pass
        self.write_json(report, "hang")
        return report

    def stalls_changed(self) -> None:
        """The episodes changed: stalls.json in the report directory says so at once."""
        if not self.settings.report_dir or self.watch is None:
            return
        try:
            records, omitted, total = self.watch.ledger.read()
        except Exception as exc:
            self.fault("store channel", exc)
            return
        evidence.write_stalls(self.settings.report_dir, episodes.stalls_document(records, omitted, total))

    def stall_summary(self, wait_s: float = 0.0) -> None:
        """Rank 0, at the end of the run: how many stalls, how long ranks waited, the longest (one line)."""
        if self.rank != 0 or self.watch is None or not self.watch.saw_episodes:
            return  # a run without a stall asks the store nothing at its end
        try:
            records, omitted, total = self.watch.ledger.read()
            until = time.monotonic() + wait_s  # an episode another rank is closing right now
            while any(r.get("seconds") is None for r in records) and time.monotonic() < until:
                time.sleep(0.1)
                records, omitted, total = self.watch.ledger.read()
        except Exception as exc:
            self.fault("store channel", exc)
            return
        line = episodes.summary_line(records, omitted, total)
        if line is None:
            return
        if self.settings.report_dir:
            evidence.write_stalls(self.settings.report_dir, episodes.stalls_document(records, omitted, total))
            line += f"; every stall in {os.path.join(self.settings.report_dir, episodes.STALLS_FILE)}"
        self.say(line)

    def end(self, report: Report | None, why: list[str], rendered_here: bool,
            findings: list[Finding] | None = None) -> None:
        """A verdict ends the job: this rank says why (the deciding rank printed the report), then ends."""
        from distdoctor.world.watchdog import flush_std_streams  # the cross-rank machinery stays off the local-only path

        self.concluded = True
        for line in why:
            self.say(line)
        if report is None:
            report = self.report(list(findings or ()), ranks=list(range(self.world)))
        for hook in list(api.EXIT_HOOKS):
            try:
                hook(report)
            except Exception as exc:
                self.fault("exit hook", exc)
        self.stall_summary()
        evidence.finish(self.settings.report_dir, self.rank, self.world, self.flight, self.watch is not None and self.watch.saw_episodes)
        flush_std_streams()
        os._exit(api.HANG_EXIT_CODE)
