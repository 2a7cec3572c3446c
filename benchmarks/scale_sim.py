"""Simulated ranks of a guarded job: the guard's real watchdog, side channel and diagnosis on one real TCPStore.

No process groups: each simulated rank is a thread running distdoctor's own EpisodeWatch with a
SideChannel of its own (its own client connection, opened lazily as a real rank's is, its hello
published through its process's shared client as a real rank's goes through torch's), over a
stand-in for torch's flight recorder (counters that move while the job is healthy and stop at a
stall) and a stand-in host whose answers are realistic snapshots (about 2 KB, as a DDP rank's
are). Threads are spread over a few processes (a Python process per rank is too heavy here). The
store is one real TCPStore in the calling process, as torchrun's agent hosts it.

Phases, driven by the caller: healthy (every counter moves: the guard's steady store load is
measured), then a stall (every rank but the straggler waits in all_reduce #9; the straggler sleeps
at its data loader's line, or, with straggler=None, every rank waits), then the verdict: which
ranks it names, when, how many requests and bytes it cost.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HEALTHY, WAITING, STOP, MEASURE = 0, 1, 3, 4  # MEASURE: healthy, its store load counted
SEQ = 9  # the collective the stall is in


def snapshot(rank: int, world: int, waiting: bool) -> dict[str, Any]:
    """A DDP rank's published state, as the guard's answer carries it (about 2 KB)."""
    from distdoctor.diagnosis.snapshot import RUNNING, Frame, GroupProgress, PendingOp, RankSnapshot

    recent = tuple(PendingOp("all_reduce" if s % 3 else "broadcast", s, ((165,),), ("Float",), "completed")
                   for s in range(SEQ - 8, SEQ))
    if waiting:
        group = GroupProgress("0", (), SEQ, SEQ - 1, PendingOp("all_reduce", SEQ, ((165,),), ("Float",), "scheduled", 5.2),
                              recent + (PendingOp("all_reduce", SEQ, ((165,),), ("Float",), "scheduled"),))
        stack = (Frame("train.py", 17, "<module>", "loss.backward()"),
                 Frame("/usr/lib/python3/site-packages/torch/_tensor.py", 626, "backward"),
                 Frame("/usr/lib/python3/site-packages/torch/autograd/__init__.py", 347, "backward"))
        where = stack[0]
    else:
        group = GroupProgress("0", (), SEQ - 1, SEQ - 1, None, recent)
        stack = (Frame("train.py", 14, "<module>", "batch = next(loader)"),
                 Frame("/usr/lib/python3.11/queue.py", 180, "get"))
        where = stack[0]
    snap = RankSnapshot(rank=rank, host=f"node{rank // 8:04d}", pid=10_000 + rank, status=RUNNING, groups=(group,),
                        stack=stack, where=where, time=time.time(), collectives=SEQ, source="guard")
    return {"snapshot": snap.to_dict(), "running": [], "dropped": []}


class Flight:
    """torch's flight recorder as the watchdog reads it: counters that move while healthy."""

    usable, problem = True, ""

    def __init__(self, phase: Any, late: bool) -> None:
        self.phase, self.late, self.count = phase, late, 0

    def status(self) -> dict[str, tuple[int, int]]:
        if self.phase.value in (HEALTHY, MEASURE):
            self.count += 1
            return {"0": (self.count, self.count)}
        return {"0": (SEQ - 1, SEQ - 1)} if self.late else {"0": (SEQ, SEQ - 1)}


class Host:
    """What the watchdog asks of its Guard, answered like a rank of a DDP job."""

    def __init__(self, rank: int, world: int, phase: Any, late: bool, events: Any) -> None:
        self.rank, self.world, self.started = rank, world, time.monotonic()
        self.phase, self.late, self.events = phase, late, events
        self.side: Any = None
        self.faults: list[str] = []
        self.answers = {w: snapshot(rank, world, w) for w in (True, False)}

    def state(self, group: str | None = None) -> dict[str, Any]:
        waiting = self.phase.value == WAITING and not self.late
        out = dict(self.answers[waiting])
        out["snapshot"] = {**out["snapshot"], "time": time.time()}
        return out

    def group_ranks(self, name: str) -> list[int]:
        return list(range(self.world))

    def group_timeout(self, name: str) -> float | None:
        return 1800.0

    def group_grace(self, name: str) -> float:
        return 5.0

    def wait_group(self, pg: Any) -> str:
        return "0"

    def decide(self, states: dict[int, Any], ranks: list[int], waited: float, world_known: bool) -> list[Any]:
        from distdoctor.embedded.guard.verdict import decide

        return decide(states, ranks, waited, world_known=world_known)

    def show(self, findings: list[Any], heading: str, ranks: list[int], decision: Any) -> None:
        first = findings[0] if findings else None
        self.events.put(("verdict", self.rank, time.monotonic(), first.id if first else None,
                         list(first.ranks) if first else [], first.data.get("heard_from") if first else None,
                         self.side.traffic.bytes_read if self.side is not None else 0, heading))

    def say(self, line: str) -> None:
        pass

    def note(self, line: str) -> None:
        pass

    def end(self, report: Any, why: list[str], rendered_here: bool, findings: Any = None) -> None:
        pass

    def fault(self, part: str, exc: BaseException) -> None:
        self.faults.append(f"{part}: {type(exc).__name__}: {exc}")

    def stalls_changed(self) -> None:
        pass


def _worker(ranks: list[int], world: int, port: int, prefix: str, phase: Any, straggler: int | None,
            hang_timeout: float, poll_s: float, events: Any, done: Any) -> None:
    import random

    from distdoctor.embedded.guard.channel import SideChannel, open_client
    from distdoctor.embedded.guard.record import Recorder
    from distdoctor.embedded.guard.watch import EpisodeWatch

    def connect() -> Any:
        return open_client("127.0.0.1", port)

    shared = connect()  # each real rank's hello goes through torch's own (already open) client
    watches = []
    for rank in ranks:
        host = Host(rank, world, phase, rank == straggler, events)
        side = SideChannel(None, prefix, connect)
        side.torch_client = shared
        side.hello(rank, {"host": f"node{rank // 8:04d}", "boot": "sim", "pidns": 0, "pid": 10_000 + rank})
        host.side = side
        watch = EpisodeWatch(host, Recorder(), side, hang_timeout=hang_timeout, answer_s=1.5, poll_s=poll_s,
                             on_hang="auto", flight=Flight(phase, rank == straggler), world=world)
        watches.append((host, side, watch))
    # Not all at once, as a job's ranks start: each watchdog's own first poll is jittered too.
    for _, _, watch in watches:
        time.sleep(random.uniform(0, 0.002))
        watch.start()
    marks: dict[int, int] = {}
    last = None
    while phase.value != STOP:
        if phase.value != last:
            last = phase.value
            marks[last] = sum(side.traffic.total for _, side, _ in watches)
            events.put(("mark", ranks[0], last, marks[last], time.monotonic()))
        time.sleep(0.02)
    for _, _, watch in watches:
        watch.stop()
    total = sum(side.traffic.total for _, side, _ in watches)
    faults = [f for host, _, _ in watches for f in host.faults]
    connected = sum(1 for _, side, _ in watches if side.connected)
    events.put(("done", ranks[0], total, faults, connected, len(ranks)))
    done.wait(30)
    os._exit(0)  # the watchdogs' daemon threads and store clients end with the process


def run(world: int, *, straggler: int | None, hang_timeout: float = 5.0, healthy_s: float = 20.0,
        warm_s: float | None = None, settle_s: float = 4.0, processes: int = 8, poll_s: float = 0.25,
        bound_s: float = 120.0) -> dict[str, Any]:
    """One simulated job: ``warm_s`` healthy (every rank's first poll and connection: one busy interval by
    default), ``healthy_s`` healthy with the store load counted, then a stall until the verdict (or ``bound_s``)."""
    from distdoctor.embedded.guard import cadence

    warm_s = cadence.busy_interval_s(world) if warm_s is None else warm_s
    server, phase, events, done, procs = _workers(world, processes, "sim", _worker,
                                                  lambda: (straggler, hang_timeout, poll_s))
    out: dict[str, Any] = {"world": world, "straggler": straggler, "hang_timeout": hang_timeout}
    try:
        out.update(_drive(world, phase, events, warm_s, healthy_s, settle_s, hang_timeout, bound_s))
    finally:
        phase.value = STOP
        out.update(_finish(events, len(procs), out))
        _stop(done, procs)
    del server  # the store outlived every client
    return out


def _workers(world: int, processes: int, name: str, target: Any, extra: Any) -> tuple:
    """One real TCPStore here and the simulated ranks over ``processes`` processes: (server, phase, events,
    done, the processes); each runs target(ranks, world, port, prefix, phase, *extra(), events, done)."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    ctx = mp.get_context("fork")
    phase, events, done = ctx.Value("i", -1), ctx.Queue(), ctx.Event()
    prefix = f"distdoctor/guard/{name}{os.getpid()}"
    per = -(-world // processes)
    groups = [list(range(i, min(i + per, world))) for i in range(0, world, per)]
    procs = [ctx.Process(target=target, args=(g, world, server.port, prefix, phase, *extra(), events, done), daemon=True)
             for g in groups]
    for proc in procs:
        proc.start()
    return server, phase, events, done, procs


def _stop(done: Any, procs: list[Any]) -> None:
    done.set()
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def _drive(world: int, phase: Any, events: Any, warm_s: float, healthy_s: float, settle_s: float,
           hang_timeout: float, bound_s: float) -> dict[str, Any]:
    marks: dict[int, dict[int, int]] = {}
    verdicts: list[tuple] = []

    def drain(until: float) -> None:
        while time.monotonic() < until:
            try:
                item = events.get(timeout=max(0.01, min(0.2, until - time.monotonic())))
            except Exception:
                continue
            if item[0] == "mark":
                marks.setdefault(item[2], {})[item[1]] = item[3]
            elif item[0] == "verdict":
                verdicts.append(item)

    drain(time.monotonic() + 3.0)  # every worker has made its ranks (hellos published)
    phase.value = HEALTHY
    drain(time.monotonic() + warm_s)
    phase.value = MEASURE
    drain(time.monotonic() + healthy_s)
    phase.value = WAITING
    stall_at = time.monotonic()
    until = stall_at + bound_s
    while time.monotonic() < until and not verdicts:
        drain(time.monotonic() + 0.2)
    drain(time.monotonic() + settle_s)  # the verdicts that follow the first (a revision, another owner)
    stalled_s = time.monotonic() - stall_at
    healthy_requests = sum(marks.get(WAITING, {}).values()) - sum(marks.get(MEASURE, {}).values())
    first = verdicts[0] if verdicts else None
    return {
        "healthy_s": healthy_s, "healthy_requests": healthy_requests,
        "healthy_rate": healthy_requests / healthy_s, "healthy_rate_per_rank": healthy_requests / healthy_s / world,
        "verdict_after_s": (first[2] - stall_at) if first else None,
        "after_hang_timeout_s": (first[2] - stall_at - hang_timeout) if first else None,
        "verdict": first[3] if first else None, "named": first[4] if first else [],
        "heard_from": first[5] if first else None, "look_bytes": first[6] if first else None,
        "verdicts": [(v[1], round(v[2] - stall_at, 2), v[3], v[4][:8], v[7][:60]) for v in verdicts],
        "stall_marks": sum(marks.get(WAITING, {}).values()), "stalled_s": stalled_s,
    }


def _done_reports(events: Any, workers: int, wait_s: float = 30.0) -> list[tuple]:
    """The workers' ("done", ...) reports, as many as come within ``wait_s`` (other events skipped)."""
    done: list[tuple] = []
    deadline = time.monotonic() + wait_s
    while len(done) < workers and time.monotonic() < deadline:
        try:
            item = events.get(timeout=0.5)
        except Exception:
            continue
        if item[0] == "done":
            done.append(item)
    return done


def _finish(events: Any, workers: int, out: dict[str, Any]) -> dict[str, Any]:
    done = _done_reports(events, workers)
    got, totals, connected = len(done), sum(item[2] for item in done), sum(item[4] for item in done)
    faults = [fault for item in done for fault in item[3]]
    stall_requests = totals - out.get("stall_marks", 0) if "stall_marks" in out else None
    return {"requests": totals, "faults": faults[:20], "fault_count": len(faults), "connected": connected,
            "workers_done": got, "stall_requests": stall_requests,
            "stall_rate_per_rank": (stall_requests / out["stalled_s"] / out["world"]) if stall_requests is not None
            and out.get("stalled_s") else None}


def asking_rank_cost(world: int, straggler: int) -> dict[str, Any]:
    """The asking rank's own share of a look, apart from how fast the answers come: ``world`` answers
    already in one real TCPStore; the rank reads them (the roster, then multi_get) and diagnoses them."""
    import torch.distributed as dist

    from distdoctor.embedded.guard.cadence import AnswerWait
    from distdoctor.embedded.guard.channel import SideChannel, open_client
    from distdoctor.embedded.guard.looks import Board, parse_answer
    from distdoctor.embedded.guard.verdict import decide

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    writer = SideChannel(None, "cost", lambda: open_client("127.0.0.1", server.port))
    writer.client(wait_s=30)
    for rank in range(world):
        writer.publish("look/1/state", rank, snapshot(rank, world, rank != straggler))
    writer.count(writer.key("flushed"), 0)
    asker = SideChannel(None, "cost", lambda: open_client("127.0.0.1", server.port))
    asker.client(wait_s=30)
    before, started = asker.traffic.total, time.monotonic()
    states = Board(asker, 0).collect(1, range(world), AnswerWait(0.0, 0.0, 60.0), parse_answer)
    read_s = time.monotonic() - started
    findings = decide(states, list(range(world)), 5.0)
    return {"world": world, "read_s": read_s, "diagnose_s": time.monotonic() - started - read_s,
            "requests": asker.traffic.total - before, "bytes": asker.traffic.bytes_read,
            "verdict": findings[0].id if findings else None, "named": list(findings[0].ranks) if findings else []}


# -- the slow-rank accounting at scale: every rank's windows through the store, rank 0 judging -------------

PACE_WINDOW_S = 30.0  # the default window (GuardSettings.slow_window)


def pace_window(rank: int, index: int, slow: bool, steps: int = 200, step_ms: float = 20.0) -> dict[str, Any]:
    """A window document as a guarded DDP rank publishes it: the slow rank waits at the floor (0.3 ms a step),
    every other rank 3 ms more; a profile of two paths."""
    from distdoctor.diagnosis.pace import SCHEMA, edges_ms

    wait_ms = 0.3 if slow else 3.3
    hist = [0] * (len(edges_ms()) + 1)
    hist[next(i for i, edge in enumerate(edges_ms()) if wait_ms < edge)] = steps
    wall = steps * step_ms / 1e3
    outside = wall - steps * wait_ms / 1e3
    frames = [["train.py", 40, "<module>", "x, y = next(batches)"], ["train.py", 43, "<module>", "loss.backward()"]]
    extra = 0.003 * steps if slow else 0.0
    paths = [[[0], 40, round(0.3 * (outside - extra) + extra, 4), 0.01, 0.0, 0, 40],
             [[1], 60, round(0.7 * (outside - extra), 4), 0.01, 0.0, 0, 0]]
    return {"schema": SCHEMA, "rank": rank, "host": f"node{rank // 8:04d}", "window": index, "final": False,
            "t0": time.time() - wall, "t1": time.time(), "wall_s": wall,
            "cpu": {"run_s": outside * 0.95, "runq_s": outside * 0.05, "blocked_s": steps * wait_ms / 1e3},
            "gc": {"s": 0.0, "n": 0, "full": 0},
            "waits": [{"group": "0", "kind": "collective", "waited_s": steps * wait_ms / 1e3, "regions": steps,
                       "measured_regions": steps, "steps": steps, "measured_steps": steps, "hist": hist}],
            "profile": {"samples": 100, "waiting": 0, "s": round(outside, 4), "frames": frames, "paths": paths},
            "gpu": False, "notes": []}


def _pace_worker(ranks: list[int], world: int, port: int, prefix: str, phase: Any, slow: int, window_s: float,
                 events: Any, done: Any) -> None:
    import random

    from distdoctor.diagnosis.pace_watch import Watcher
    from distdoctor.embedded.guard.channel import SideChannel, open_client
    from distdoctor.embedded.guard.pace.exchange import Exchange, interval_s
    from distdoctor.embedded.guard.record import Recorder
    from distdoctor.embedded.guard.watch import EpisodeWatch

    def connect() -> Any:
        return open_client("127.0.0.1", port)

    shared = connect()
    members = []
    for rank in ranks:
        host = Host(rank, world, phase, False, events)
        side = SideChannel(None, prefix, connect)
        side.torch_client = shared
        side.hello(rank, {"host": f"node{rank // 8:04d}", "boot": "sim", "pidns": 0, "pid": 10_000 + rank})
        host.side = side
        watch = EpisodeWatch(host, Recorder(), side, hang_timeout=60.0, answer_s=1.5, poll_s=0.25, on_hang="auto",
                             flight=Flight(phase, False), world=world)
        members.append((rank, side, watch, Exchange(side, rank)))
    interval = interval_s(window_s, world)
    due = {rank: time.monotonic() + random.uniform(0, interval) for rank in ranks}  # ranks start apart
    index = {rank: 0 for rank in ranks}
    watcher = Watcher(world, window_s) if 0 in ranks else None
    judge_at, judge_s, judgments = time.monotonic() + interval / 2, 0.0, 0
    for _, _, watch, _ in members:
        watch.start()
    marks: dict[int, int] = {}
    while phase.value != STOP:
        if phase.value not in marks:
            marks[phase.value] = sum(side.traffic.total for _, side, _, _ in members)
            events.put(("mark", ranks[0], phase.value, marks[phase.value], time.monotonic()))
        now = time.monotonic()
        for rank, side, _, exchange in members:
            if now >= due[rank] and phase.value in (HEALTHY, MEASURE):
                due[rank] = now + interval
                try:
                    exchange.publish(pace_window(rank, index[rank], rank == slow))
                    index[rank] += 1
                except Exception as exc:
                    events.put(("fault", rank, f"{type(exc).__name__}: {exc}"))
        if watcher is not None and now >= judge_at and phase.value == MEASURE:
            judge_at = now + interval / 2
            started = time.monotonic()
            try:
                watcher.feed(members[0][3].gather(), time.time())
                judgments += 1
            except Exception as exc:
                events.put(("fault", 0, f"{type(exc).__name__}: {exc}"))
            judge_s = max(judge_s, time.monotonic() - started)
            named = watcher.latest.named if watcher.latest is not None else {}
            events.put(("judged", sorted(named), [v.get("cost_ms_per_step") for v in named.values()],
                        len(watcher.totals), judge_s, judgments))
        time.sleep(0.01)
    for _, _, watch, _ in members:
        watch.stop()
    total = sum(side.traffic.total for _, side, _, _ in members)
    published = sum(side.traffic.requests.get("set", 0) for _, side, _, _ in members)
    events.put(("done", ranks[0], total, published, sum(1 for _, side, _, _ in members if side.connected), len(ranks)))
    done.wait(30)
    os._exit(0)


def pace_run(world: int, *, slow: int, seconds: float = 100.0, processes: int = 8,
             window_s: float = PACE_WINDOW_S) -> dict[str, Any]:
    """One simulated job with the slow-rank accounting: warm-up for one interval, then ``seconds`` measured."""
    from distdoctor.embedded.guard.pace.exchange import interval_s

    server, phase, events, done, procs = _workers(world, processes, "pace", _pace_worker, lambda: (slow, window_s))
    interval = interval_s(window_s, world)
    marks: dict[int, dict[int, int]] = {}
    last: tuple = ((), [], 0, 0.0, 0)
    faults: list[str] = []
    totals = {"requests": 0, "published": 0, "connected": 0}

    def drain(until: float) -> None:
        nonlocal last
        while time.monotonic() < until:
            try:
                item = events.get(timeout=0.2)
            except Exception:
                continue
            if item[0] == "mark":
                marks.setdefault(item[2], {})[item[1]] = item[3]
            elif item[0] == "judged":
                last = item[1:]
            elif item[0] == "fault":
                faults.append(item[2])

    try:
        drain(time.monotonic() + 3.0)
        phase.value = HEALTHY
        drain(time.monotonic() + interval)
        phase.value = MEASURE
        drain(time.monotonic() + seconds)
        phase.value = WAITING  # the measurement's end mark (nothing stalls: the counters go on moving)
        drain(time.monotonic() + 1.0)
    finally:
        phase.value = STOP
        for item in _done_reports(events, len(procs)):
            totals["requests"] += item[2]
            totals["published"] += item[3]
            totals["connected"] += item[4]
        _stop(done, procs)
    del server
    measured = sum(marks.get(WAITING, {}).values()) - sum(marks.get(MEASURE, {}).values())
    named, costs, heard, judge_s, judgments = last
    return {"world": world, "window_s": window_s, "interval_s": interval, "seconds": seconds,
            "requests": measured, "rate_per_rank": measured / seconds / world,
            "publish_rate_per_rank": 1.0 / interval, "poll_rate_per_rank": None, "named": list(named),
            "cost_ms": costs[0] if costs else None, "windows_read": heard, "judge_s": judge_s, "judgments": judgments,
            "connected": totals["connected"], "fault_count": len(faults), "faults": faults[:5],
            "bytes_per_window": len(json.dumps(pace_window(0, 0, False)))}
