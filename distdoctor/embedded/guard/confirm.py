"""A verdict confirmed before it is said or acted on: every rank that answered the look says whether it moved since."""

# A look's answers come over seconds (diagnosis.cut: a cut, not an instant). A cut whose sequence
# numbers are impossible together is looked at again; one that is possible may still have been taken
# while the job moved. So before the rank that asked says a verdict or ends the job, it publishes the
# verdict as pending; every rank that answered compares its progress now with its progress when it
# answered -- the flight recorder's issued/completed counts of the look's group and of every group it
# waited in, its guarded calls, the start of its own stall -- and adds 1 ("still") or MOVED to the
# look's acknowledgement counter: one request per rank, the acknowledgement it sends anyway. The asker
# compares its own the same way (a read of its own recorder, no request). The verdict stands only
# when every answering rank said "still" in time; a rank that moved, or silence past the deadline,
# means the answers were not one moment: no verdict, the stall is looked at again.

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

MOVED = 1 << 20  # added by a rank that moved: counts of "still" stay below it, "moved" above


@dataclass(frozen=True)
class Marks:
    """A rank's progress at one moment: per group (issued, completed) and the start of its stall."""

    groups: tuple[tuple[str, tuple[int, int]], ...] = ()
    since: float | None = None

    def waiting_in(self) -> set[str]:
        return {group for group, (issued, done) in self.groups if issued > done}

    def moved(self, now: "Marks", groups: Iterable[str]) -> bool:
        """Whether ``now`` differs from these marks in any of ``groups`` or in the stall's start."""
        before, after = dict(self.groups), dict(now.groups)
        return self.since != now.since or any(before.get(g) != after.get(g) for g in groups)


def marks(status: Mapping[str, tuple[int, int]] | None, recorder: Any, since: float | None) -> Marks:
    """This rank's marks: the recorder's counts per group (``status``, None without the recorder),
    else the guard's own count of the calls issued and completed per group."""
    if status is None:
        status = {group: (issued - 1, recorder.completed.get(group, -1)) for group, issued in recorder.seqs.items()}
    return Marks(tuple(sorted((str(g), (int(i), int(c))) for g, (i, c) in status.items())), since)


class Answered:
    """The marks this rank answered each look with, and the looks whose pending verdict it acknowledged."""

    KEEP = 8

    def __init__(self) -> None:
        self.marks: dict[int, tuple[Marks, str]] = {}
        self.acked: set[tuple[int, Any]] = set()

    def keep(self, look: int, mine: Marks, group: str) -> None:
        self.marks[look] = (mine, group)
        for old in sorted(self.marks)[:-self.KEEP]:
            self.marks.pop(old, None)

    def moved(self, look: int, now: Marks) -> bool:
        """Whether this rank moved, in the look's group or a group it waited in, since it answered
        ``look``; True when it kept no marks of that answer (nothing proves it still)."""
        answered = self.marks.get(look)
        if answered is None:
            return True
        mine, group = answered
        return mine.moved(now, {group, *mine.waiting_in()})


def await_acks(acks: Callable[[], int], answers: int, deadline_s: float,
               stop: Callable[[], bool] = lambda: False, poll_s: float = 0.05) -> tuple[int, int]:
    """(ranks that said "still", ranks that said "moved") once every one of ``answers`` said, a rank
    moved, ``deadline_s`` passed or ``stop()``."""
    until = time.monotonic() + deadline_s
    still = moved = 0
    while True:
        count = acks()
        still, moved = count % MOVED, count // MOVED
        if moved or still >= answers or time.monotonic() >= until or stop():
            return still, moved
        time.sleep(poll_s)


def unconfirmed(still: int, moved: int, answers: int) -> str:
    """Why a pending verdict does not stand, in words ("" when it does)."""
    if moved:
        return (f"{moved} rank{'s' if moved > 1 else ''} moved after answering: the answers were not one "
                "moment of the job")
    if still < answers:
        return f"only {still} of the {answers} ranks that answered confirmed their answer in time"
    return ""
