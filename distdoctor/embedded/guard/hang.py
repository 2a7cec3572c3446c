"""Hang diagnosis: a side channel through the c10d store, every rank's state, one cross-rank verdict."""

# When a guarded call has run longer than ``hang_timeout``, this rank's watchdog thread claims the
# episode and sets a request key. Every rank's watchdog thread looks for that key every
# ``poll_s`` through its own TCPStore client (one small request; a thread blocked in a store
# wait instead would abort the process at exit when rank 0 hosts the store), so a rank whose
# main thread is asleep, stuck in C++ or in another collective still answers: it publishes its
# state (the calls it is in, its last completed sequence numbers, its main thread's stack). The claiming rank collects
# the states for ``answer_s`` seconds at most, names the cause, writes the report, publishes the
# verdict and (by default) ends the job. Every store operation has a deadline; the stuck process
# group is never used.

from __future__ import annotations

import json
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Any, Callable

from distdoctor.embedded.guard.record import CallRecord, Recorder, thread_stack, user_frame
import uuid
from distdoctor.core.findings import Finding

STORE_OP_TIMEOUT_S = 5.0


def _tcp_store_address(store: Any) -> tuple[str, int] | None:
    """(host, port) of the TCPStore under a (Prefix)Store; None for a FileStore, HashStore..."""
    seen = 0
    while store is not None and seen < 8:
        if hasattr(store, "host") and hasattr(store, "port"):
            try:
                return str(store.host), int(store.port)
            except Exception:
                return None
        store = getattr(store, "underlying_store", None)
        seen += 1
    return None


class SideChannel:
    """A client of the job's TCPStore of its own (not the process group's) under a per-job prefix."""

    def __init__(self, talk: Any, prefix: str) -> None:
        self.talk, self.prefix = talk, prefix

    @classmethod
    def open(cls, default_store: Any, generation: int, timeout_s: float = STORE_OP_TIMEOUT_S) -> "SideChannel | None":

        import torch.distributed as dist  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

        address = _tcp_store_address(default_store)
        if address is None:
            return None
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        # Every rank proposes a nonce; compare_set keeps the first, so all agree without waiting.
        nonce = default_store.compare_set(f"distdoctor/guard/nonce/{restart}/{generation}", "", uuid.uuid4().hex)
        prefix = f"distdoctor/guard/{nonce.decode() if isinstance(nonce, bytes) else nonce}"
        talk = dist.TCPStore(address[0], address[1], is_master=False, timeout=timedelta(seconds=timeout_s),
                             wait_for_workers=False)
        return cls(talk, prefix)

    def key(self, *parts: Any) -> str:
        return "/".join([self.prefix, *map(str, parts)])

    def put(self, key: str, value: Any) -> None:
        self.talk.set(key, json.dumps(value, default=str))

    def get(self, key: str) -> Any:
        return json.loads(self.talk.get(key))

    def claim(self, key: str, value: str) -> str:
        got = self.talk.compare_set(key, "", value)
        return got.decode() if isinstance(got, bytes) else str(got)

    def present(self, keys: list[str]) -> list[bool]:
        return [bool(self.talk.check([k])) for k in keys]


def rank_state(recorder: Recorder, rank: int, phase: str, groups: list[str],
               dropped: list[CallRecord] = ()) -> dict[str, Any]:
    """What this rank publishes: the calls it is in, its progress per group, its stack."""
    now = recorder.clock()
    running = recorder.running_records()
    thread = running[0].thread if running else threading.main_thread().ident
    stack = thread_stack(thread or 0)
    if phase == "running" and not threading.main_thread().is_alive():
        phase = "finished"
    recent = {g: recorder.recent(g, 8) for g in groups}
    return {
        "rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "phase": phase,
        "running": [{**r.to_dict(), "age_s": round(now - r.started, 2)} for r in running],
        "completed": dict(recorder.completed),
        "recent": {g: [r.site for r in calls] for g, calls in recent.items()},
        "last": {g: calls[-1].to_dict() for g, calls in recent.items() if calls},
        "stack": stack, "where": user_frame(stack), "dropped": [r.to_dict() for r in dropped][-16:],
    }


class HangWatch:
    """The watchdog thread (detects) and the listener thread (answers) of one guarded process."""

    def __init__(self, recorder: Recorder, side: SideChannel | None, *, rank: int, world: int,
                 hang_timeout: float, answer_s: float, poll_s: float,
                 state: Callable[[], dict[str, Any]], group_ranks: Callable[[str], list[int]],
                 conclude: Callable[..., None]) -> None:
        self.recorder, self.side, self.rank, self.world = recorder, side, rank, world
        self.hang_timeout, self.answer_s, self.poll_s = hang_timeout, answer_s, poll_s
        self.state, self.group_ranks, self.conclude = state, group_ranks, conclude
        self.stopped = threading.Event()
        self.episode = threading.Event()
        self.answered = threading.Event()
        self.answers = 0

    def start(self) -> "HangWatch":
        self.thread = threading.Thread(target=self._watch, name="distdoctor-guard-watch", daemon=True)
        self.thread.start()
        return self

    def stop(self, join_s: float = 0.0) -> None:
        """Stop the thread; with join_s, wait that long for a store request it may be in."""
        self.stopped.set()
        thread = getattr(self, "thread", None)
        if join_s and thread is not None and thread is not threading.current_thread():
            thread.join(join_s)

    # -- detection (this rank's own calls) ------------------------------------------------------
    def _watch(self) -> None:
        while not self.stopped.wait(self.poll_s):
            try:
                self.recorder.poll()
                oldest = self.recorder.oldest_running()
                if oldest is not None and self.recorder.clock() - oldest.started >= self.hang_timeout:
                    if not self.episode.is_set():
                        self.episode.set()
                        self._request(oldest)
                if self.side is not None and not self.answered.is_set() and not self.stopped.is_set():
                    if self.side.present([self.side.key("request")])[0]:
                        self._answer()
            except Exception:  # the watchdog must outlive any fault of its own
                continue

    def _request(self, stuck: CallRecord) -> None:
        if self.side is None:
            self._render_local(stuck)
            return
        try:
            self.side.claim(self.side.key("renderer"), str(self.rank))
            self.side.claim(self.side.key("request"), json.dumps({"rank": self.rank, "call": stuck.to_dict()}))
        except Exception:
            self._render_local(stuck)

    def _render_local(self, stuck: CallRecord) -> None:
        from distdoctor.embedded.guard.findings import hang_findings  # the embedded modules import torch; loaded only on this path

        waited = self.recorder.clock() - stuck.started
        findings = hang_findings(stuck, [self.rank], {self.rank: self.state()}, {}, waited, 0.0)
        self.conclude(findings, True, waited)

    # -- answering (every rank, from the same thread) -----------------------------------------------------------------
    def _answer(self) -> None:
        side = self.side
        assert side is not None
        try:
            side.put(side.key("state", self.rank), self.state())
            renderer = side.claim(side.key("renderer"), str(self.rank))
        except Exception:
            return
        self.answered.set()
        if renderer == str(self.rank):
            self._render()
        else:
            self._follow(int(renderer))

    def _render(self) -> None:
        from distdoctor.embedded.guard.findings import hang_findings  # the embedded modules import torch; loaded only on this path

        side = self.side
        assert side is not None
        stuck = self.recorder.oldest_running()
        if stuck is None:  # the call completed meanwhile: nothing to diagnose
            side.put(side.key("verdict"), {"findings": [], "renderer": self.rank})
            return
        waited = self.recorder.clock() - stuck.started
        ranks = self.group_ranks(stuck.group)
        states, finals = self._collect(ranks)
        self.answers = sum(1 for r, st in states.items() if st is not None and r != self.rank)
        findings = hang_findings(stuck, ranks, states, finals, waited, self.answer_s)

        def publish() -> None:
            # After this rank wrote its report: the others end as soon as they read the verdict,
            # and a launcher then stops this rank too.
            try:
                side.put(side.key("verdict"), {"findings": [f.to_dict() for f in findings], "renderer": self.rank})
            except Exception:
                pass

        self.conclude(findings, True, waited, publish)

    def _collect(self, ranks: list[int]) -> tuple[dict[int, Any], dict[int, Any]]:
        """Every rank's state, waiting at most answer_s for the last ones."""
        side = self.side
        assert side is not None
        everyone = sorted(set(ranks) | set(range(self.world)))
        keys = {r: side.key("state", r) for r in everyone}
        until = time.monotonic() + self.answer_s
        states: dict[int, Any] = {}
        while True:
            pending = [r for r in everyone if r not in states]
            for rank, there in zip(pending, side.present([keys[r] for r in pending])):
                if there:
                    states[rank] = side.get(keys[rank])
            if len(states) == len(everyone) or time.monotonic() >= until:
                break
            time.sleep(0.05)
        finals = {}
        for rank in everyone:
            if rank not in states and side.present([side.key("final", rank)])[0]:
                finals[rank] = side.get(side.key("final", rank))
        return {r: states.get(r) for r in ranks}, finals

    def _follow(self, renderer: int) -> None:
        """Wait (bounded) for the renderer's verdict, then conclude like it."""

        side = self.side
        assert side is not None
        findings: list[Any] = []
        try:
            side.talk.wait([side.key("verdict")], timedelta(seconds=self.answer_s + STORE_OP_TIMEOUT_S))
            findings = [Finding.from_dict(f) for f in side.get(side.key("verdict")).get("findings", ())]
        except Exception:
            pass
        self._ack()
        if findings or self.episode.is_set():
            self.conclude(findings, False, 0.0)

    def _ack(self) -> None:
        try:
            if self.side is not None:
                self.side.talk.add(self.side.key("ack"), 1)
        except Exception:
            pass

    def finish(self, rendered_here: bool, grace_s: float = 1.0) -> None:
        """Before this process ends: the renderer (which may host the store) waits, at most
        grace_s, until the ranks that answered have read its verdict."""
        if not rendered_here or self.side is None or not self.answers:
            return
        until = time.monotonic() + grace_s
        try:
            while time.monotonic() < until and int(self.side.talk.add(self.side.key("ack"), 0)) < self.answers:
                time.sleep(0.02)
        except Exception:
            pass

    def publish_final(self, state: dict[str, Any]) -> None:
        """A rank that finishes leaves its last state, so a peer still waiting can say so."""
        if self.side is None:
            return
        try:
            self.side.put(self.side.key("final", self.rank), state)
        except Exception:
            pass
