"""A look at every rank through the side channel: requested, answered, collected, its verdict published and read."""

# The keys under the channel's prefix:
#   news                     a counter every event bumps (a look requested, a verdict published, an
#                            episode closed): the one key a rank polls while nothing happens to it
#   looks                    how many looks were requested (the next one is looks + 1)
#   stall/<group>/<seq>      claimed by the first rank stalled in that collective: the others join its look
#                            (its own, or the one another rank is collecting for that group right then)
#   current                  the latest look and its phase (collecting, watch, end, none, closed): a rank
#                            that stalls reads it once and joins a look still open
#   look/<n>/request         claimed with compare_set by the rank that asks: ranks that stall at once
#                            share one look (the others answer it)
#   look/<n>/state/<rank>    each rank's answer, and look/<n>/state/roster the ranks that answered
#   look/<n>/verdict         the findings (without their per-rank snapshots: every rank reads them),
#                            the action, the episode, its serial; "pending" while the answering ranks
#                            confirm it (embedded.guard.confirm): look/<n>/ack/<serial> counts their
#                            confirmations, look/<n>/ack/end the ranks that read a confirmed END
# The asking rank reads the roster and the answers it lists (embedded.guard.channel: O(1) requests
# per poll) until every rank answered or the answer deadline passed (embedded.guard.cadence).

from __future__ import annotations

import json
import time
from typing import Any, Callable, Iterable

from distdoctor.core.findings import Finding
from distdoctor.diagnosis.snapshot import RankSnapshot
from distdoctor.embedded.guard.cadence import AnswerWait
from distdoctor.embedded.guard.channel import SideChannel

STALE_REQUEST_S = 120.0   # a request older than this (its asker's clock) is not answered any more
KEEP_LOOKS = 2            # a look's keys are deleted once this many later looks were asked
COLLECTING = "collecting"
UNNUMBERED_S = 15.0       # a stall claimed this long ago and still without its look (its rank failed): taken over


class Board:
    """The look protocol of one rank on the job's side channel."""

    def __init__(self, side: SideChannel, rank: int) -> None:
        self.side, self.rank = side, rank
        self.news_seen: int | None = None
        self.answered = 0                     # the latest look this rank answered
        self.awaiting: dict[int, float] = {}  # looks this rank answered whose verdict it has not read -> since
        self.mine: list[int] = []             # looks whose answer of this rank is still in the store

    # -- news ------------------------------------------------------------------------------------
    def news(self) -> bool:
        """One request: whether anything happened since this rank last asked."""
        value = self.side.count(self.side.key("news"), 0)
        changed, self.news_seen = value != self.news_seen, value
        return changed

    def bump(self) -> None:
        self.news_seen = self.side.count(self.side.key("news"), 1)

    def latest(self) -> int:
        return self.side.count(self.side.key("looks"), 0)

    def request(self, look: int) -> dict[str, Any] | None:
        value = self.side.get_if_present(self.side.key("look", look, "request"))
        return value if isinstance(value, dict) else None

    def fresh(self, request: dict[str, Any] | None) -> bool:
        return request is not None and time.time() - float(request.get("t") or 0.0) < STALE_REQUEST_S

    # -- asking ------------------------------------------------------------------------------------
    def joinable(self, current: Any, group: str | None = None) -> bool:
        """Whether the look ``current`` describes is still being collected, or its verdict watches an
        episode still open (another rank's): a rank that stalls now joins it rather than ask for another
        (``group``: only a look at that group, the one whose transport its answers read)."""
        if not isinstance(current, dict) or not isinstance(current.get("look"), int) or not self.fresh(current):
            return False
        if current.get("rank") == self.rank:  # its own look: this rank looks again
            return False
        if group is not None:
            return current.get("group") == group and current.get("phase") == COLLECTING
        return current.get("phase") in (COLLECTING, "watch")

    def claim_stall(self, stall_key: str) -> tuple[int | None, bool]:
        """Ranks stalled in the same collective (``stall_key``: its group and sequence number) ask for
        one look between them: (its number, None while the rank that claimed it has not numbered it
        yet; whether this rank claimed it). One request for every rank but the first."""
        key = self.side.key("stall", stall_key)
        mine = json.dumps({"rank": self.rank, "t": time.time()})
        got = self.side.claim(key, mine)
        if got == mine:
            return None, True
        try:
            claimed = json.loads(got)
        except ValueError:
            claimed = None
        ours = isinstance(claimed, dict) and claimed.get("rank") == self.rank  # its own, long done: asked again
        if isinstance(claimed, dict) and isinstance(claimed.get("look"), int) and self.fresh(claimed) and not ours:
            return claimed["look"], False
        if isinstance(claimed, dict) and not ours and time.time() - float(claimed.get("t") or 0.0) < UNNUMBERED_S:
            return None, False  # numbered in a moment: this rank asks again at its next poll
        # A claim whose rank died before it numbered its look (or this rank's own): taken over.
        return None, self.side.swap(key, got, mine) == mine

    def number_stall(self, stall_key: str, look: int) -> None:
        self.side.put(self.side.key("stall", stall_key), {"rank": self.rank, "t": time.time(), "look": look})

    def claim(self, group: str, tries: int = 8, same_group: bool = False) -> tuple[int, bool]:
        """(the look to join, whether this rank asked for it): the current look while it is open (one
        request; ``same_group``: only one being collected for ``group``); else the next one, claimed with
        compare_set; a rank that loses answers the winner's look, unless that one is stale."""
        # The count is read before `current`: the asking rank writes `current` before it counts its look,
        # so a look counted before this read is seen open below, and one counted after it has this number
        # and is lost to with compare_set. (Read the other way round, two ranks stalling at once in
        # different calls could each ask a look of their own, and neither answered the other's in time.)
        look = self.latest() + 1
        current = self.side.get_if_present(self.side.key("current"))
        if self.joinable(current, group if same_group else None):
            return current["look"], False
        mine = {"rank": self.rank, "group": group, "t": time.time()}
        text = json.dumps(mine)
        for _ in range(tries):
            got = self.side.claim(self.side.key("look", look, "request"), text)
            if got == text:
                self.side.put(self.side.key("current"), {**mine, "look": look, "phase": COLLECTING})
                self.side.count(self.side.key("looks"), 1)
                self.forget(look - KEEP_LOOKS)
                return look, True
            try:
                if self.fresh(json.loads(got)):
                    return look, False
            except ValueError:
                pass
            look += 1  # an abandoned request (its asker died before it counted it): the next number
        raise RuntimeError(f"no look could be claimed after {tries} stale requests")

    def answer(self, look: int, state: dict[str, Any]) -> None:
        """This rank's answer to ``look``; its answer to the one before is deleted."""
        self.side.publish(f"look/{look}/state", self.rank, state)
        self.answered = max(self.answered, look)
        self.mine.append(look)
        # Answers to looks long done are deleted (a reader may still be reading the latest ones).
        old = [n for n in self.mine if n <= look - KEEP_LOOKS]
        self.mine = [n for n in self.mine if n > look - KEEP_LOOKS]
        self.side.forget([self.side.key("look", n, "state", self.rank) for n in old])

    def collect(self, look: int, ranks: Iterable[int], wait: AnswerWait,
                parse: Callable[[dict[str, Any]], dict[str, Any]], states: dict[int, Any] | None = None,
                stop: Callable[[], bool] = lambda: False) -> dict[int, Any]:
        """The answers to ``look`` of ``ranks`` (each through ``parse`` as it arrives), until every rank
        answered or ``wait`` says the deadline passed. ``states``: answers already read (a revision)."""
        wanted = set(ranks)
        states = dict(states or {})
        started = last = time.monotonic()
        kind = f"look/{look}/state"
        while True:
            new = [r for r in self.side.roster(kind) if r in wanted and r not in states]
            if new:
                for rank, value in self.side.read_many(kind, new, listed=new).items():
                    states[rank] = parse(value) if isinstance(value, dict) else value
                last = time.monotonic()
            now = time.monotonic()
            if wanted <= set(states) or wait.done(now - started, now - last) or stop():
                return states
            time.sleep(0.1)

    def late_answers(self, look: int, ranks: Iterable[int], have: Iterable[int]) -> list[int]:
        """Ranks among ``ranks`` that answered ``look`` and are not in ``have`` (one request)."""
        known, wanted = set(have), set(ranks)
        return [r for r in self.side.roster(f"look/{look}/state") if r in wanted and r not in known]

    # -- the verdict -----------------------------------------------------------------------------
    def publish(self, look: int, findings: list[Finding], renderer: int, action: str, reason: str,
                episode: int | None, serial: int = 0, pending: bool = False, answers: int = 0) -> None:
        """The verdict of ``look``; ``pending``: said only once the ranks that answered confirm it;
        ``answers``: how many other ranks answered the look (the readers an end waits for)."""
        self.side.put(self.side.key("look", look, "verdict"),
                      {"findings": [slim(f) for f in findings], "renderer": renderer, "action": action,
                       "reason": reason, "episode": episode, "serial": serial, "pending": pending,
                       "answers": answers})
        if not pending:
            self._phase(look, action, episode)
        self.bump()

    def _phase(self, look: int, phase: str, episode: int | None) -> None:
        """The current look's phase (collecting, watch, end, none, closed), as a stalling rank reads it."""
        self.side.put(self.side.key("current"), {"rank": self.rank, "look": look, "t": time.time(),
                                                 "phase": phase, "episode": episode})

    def verdict(self, look: int) -> dict[str, Any] | None:
        value = self.side.get_if_present(self.side.key("look", look, "verdict"))
        return value if isinstance(value, dict) else None

    def ack(self, look: int, what: Any = "end", by: int = 1) -> None:
        """Count this rank in ``look/<n>/ack/<what>`` (a confirmation: 1 still, confirm.MOVED moved)."""
        self.side.count(self.side.key("look", look, "ack", what), by)

    def acks(self, look: int, what: Any = "end") -> int:
        return self.side.count(self.side.key("look", look, "ack", what), 0)

    def closed(self, episode: int) -> bool:
        return self.side.get_if_present(self.side.key("episode", episode, "closed")) is not None

    def close(self, episode: int, seconds: float, look: int | None = None) -> None:
        self.side.put(self.side.key("episode", episode, "closed"), round(seconds, 3))
        if look is not None:
            self._phase(look, "closed", episode)
        self.bump()

    def forget(self, look: int) -> None:
        """A look long done: its request, roster, verdict and acks (each rank deletes its own answer)."""
        if look >= 1:
            self.side.forget([self.side.key("look", look, part) for part in ("request", "verdict", "ack/end")]
                             + [self.side.key(f"look/{look}/state", "roster")])


def slim(finding: Finding) -> dict[str, Any]:
    """A finding as every rank reads it from the store: without its per-rank snapshots (at 4,096
    ranks they are megabytes; the deciding rank's report keeps them)."""
    out = finding.to_dict()
    if isinstance(out.get("data"), dict) and "snapshots" in out["data"]:
        out["data"] = {k: v for k, v in out["data"].items() if k != "snapshots"}
    return out


def parse_answer(value: dict[str, Any]) -> dict[str, Any]:
    """An answer with its snapshot read at once (a look over thousands of ranks reads them while the
    last ones are still on their way, not all after)."""
    snap = value.get("snapshot")
    if isinstance(snap, dict):
        parsed = RankSnapshot.from_dict(snap)
        if parsed is not None:
            parsed.to_dict()  # made now, kept: the verdict's findings carry every snapshot
        return {**value, "snapshot": parsed}
    return value
