"""Hang diagnosis: a side channel through the c10d store, every rank's snapshot, one cross-rank verdict."""

# A rank is stuck when a guarded call has run longer than ``hang_timeout``, or when torch's
# flight recorder shows one of its groups with a collective enqueued and not completed, unmoved
# for ``hang_timeout`` (DDP's all-reduce in loss.backward(), FSDP's all-gather: collectives
# issued in C++). Its watchdog thread then claims the episode and sets a request key. Every
# rank's watchdog thread looks for that key every ``poll_s`` through its own TCPStore client
# (one small request; a thread blocked in a store wait instead would abort the process at exit
# when rank 0 hosts the store), so a rank whose main thread is asleep, stuck in C++ or in
# another collective still answers: it publishes its RankSnapshot (diagnosis.snapshot) and
# leaves its evidence in the report directory. The claiming rank collects the snapshots for
# ``answer_s`` seconds at most, adds the final snapshots of ranks that raised or left, asks
# diagnosis.diagnose for the cause, writes the report, publishes the verdict and (by default)
# ends the job. Every store operation has a deadline; the stuck process group is never used.

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from datetime import timedelta
from typing import Any, Callable

from distdoctor.core.findings import Finding
from distdoctor.embedded.guard.flight import StallClock
from distdoctor.embedded.guard.peers import absent_snapshot
from distdoctor.embedded.guard.record import Recorder

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

    def read_many(self, kind: str, ranks: list[int]) -> dict[int, Any]:
        """The values of ``kind/<rank>`` that are there (malformed ones are left out)."""
        out = {}
        for rank, there in zip(ranks, self.present([self.key(kind, r) for r in ranks])):
            if there:
                try:
                    out[rank] = self.get(self.key(kind, rank))
                except Exception:
                    continue
        return out


class HangWatch:
    """The watchdog thread of one guarded process: detects a stall, answers requests, renders verdicts."""

    def __init__(self, recorder: Recorder, side: SideChannel | None, *, rank: int, world: int,
                 hang_timeout: float, answer_s: float, poll_s: float,
                 state: Callable[[], dict[str, Any]], group_ranks: Callable[[str], list[int]],
                 conclude: Callable[..., None], decide: Callable[..., list[Finding]], flight: Any = None) -> None:
        self.recorder, self.side, self.rank, self.world = recorder, side, rank, world
        self.hang_timeout, self.answer_s, self.poll_s = hang_timeout, answer_s, poll_s
        self.state, self.group_ranks, self.conclude = state, group_ranks, conclude
        self.flight, self.stalls = flight, StallClock()
        self.decide = decide
        self.stopped = threading.Event()
        self.episode = threading.Event()
        self.answered = threading.Event()
        self.answers = 0
        self.stalled: tuple[str, float] | None = None

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

    # -- detection (this rank's own calls, and every collective the recorder saw) -----------------
    def stuck(self) -> tuple[str, float] | None:
        """(group, seconds) of this rank's longest wait: a guarded call or a recorded collective."""
        oldest = self.recorder.oldest_running()
        mine = (oldest.group, self.recorder.clock() - oldest.started) if oldest is not None else None
        found = [s for s in (mine, self.stalled) if s is not None]
        return max(found, key=lambda s: s[1]) if found else None

    def _watch(self) -> None:
        while not self.stopped.wait(self.poll_s):
            try:
                self.recorder.poll()
                if self.flight is not None and self.flight.usable:
                    self.stalled = self.stalls.update(self.flight.status(), time.monotonic())
                stuck = self.stuck()
                if stuck is not None and stuck[1] >= self.hang_timeout and not self.episode.is_set():
                    self.episode.set()
                    self._request(stuck)
                if self.side is not None and not self.answered.is_set() and not self.stopped.is_set():
                    if self.side.present([self.side.key("request")])[0]:
                        self._answer()
            except Exception:  # the watchdog must outlive any fault of its own
                continue

    def _request(self, stuck: tuple[str, float]) -> None:
        if self.side is None:
            self._render_local(stuck)
            return
        try:
            self.side.claim(self.side.key("renderer"), str(self.rank))
            self.side.claim(self.side.key("request"), json.dumps({"rank": self.rank, "group": stuck[0]}))
        except Exception:
            self._render_local(stuck)

    def _render_local(self, stuck: tuple[str, float]) -> None:
        own = self.state()
        findings = self._decide({self.rank: own}, self.group_ranks(stuck[0]), stuck[1], local=True)
        self.conclude(findings, True, stuck[1])

    def _decide(self, states: dict[int, Any], ranks: list[int], waited: float, local: bool = False) -> list[Finding]:
        return self.decide(states, ranks, waited, world_known=not local)

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
        side = self.side
        assert side is not None
        stuck = self.stuck()
        if stuck is None:  # the call completed meanwhile: nothing to diagnose
            side.put(side.key("verdict"), {"findings": [], "renderer": self.rank})
            return
        ranks = self.group_ranks(stuck[0])
        states = self._collect(ranks)
        self.answers = sum(1 for r in states if r != self.rank and not states[r].get("absent")
                           and not states[r].get("final"))
        findings = self._decide(states, ranks, stuck[1])

        def publish() -> None:
            # After this rank wrote its report: the others end as soon as they read the verdict,
            # and a launcher then stops this rank too.
            try:
                side.put(side.key("verdict"), {"findings": [f.to_dict() for f in findings], "renderer": self.rank})
            except Exception:
                pass

        self.conclude(findings, True, stuck[1], publish)

    def _collect(self, ranks: list[int]) -> dict[int, Any]:
        """Every rank's state (live, or the final one it left), waiting at most answer_s for the last ones."""
        side = self.side
        assert side is not None
        until = time.monotonic() + self.answer_s
        states: dict[int, Any] = {}
        while True:
            states.update(side.read_many("state", [r for r in ranks if r not in states]))
            states.update(side.read_many("final", [r for r in ranks if r not in states]))
            if len(states) == len(ranks) or time.monotonic() >= until:
                break
            time.sleep(0.05)
        hellos = side.read_many("hello", [r for r in ranks if r not in states])
        for rank in ranks:
            if rank not in states:
                states[rank] = {"snapshot": absent_snapshot(rank, hellos.get(rank), self.answer_s).to_dict(),
                                "absent": True}
        return states

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

    def publish(self, kind: str, value: dict[str, Any]) -> None:
        """Leave ``kind/<rank>`` (hello at start, final at the end) for the others to read."""
        if self.side is None:
            return
        try:
            self.side.put(self.side.key(kind, self.rank), value)
        except Exception:
            pass
