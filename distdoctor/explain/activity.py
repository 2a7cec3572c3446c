"""Who complained, who went quiet, who kept going: a rank's output set against its peers' first complaint."""

# A timeout says only that the ranks reporting it waited. Which rank they waited for, and why, the
# other ranks' output tells:
# - a rank whose own lines (its prefix, its file) go on after its peers' first complaint was alive
#   and working: busy elsewhere (the straggler);
# - a rank whose output stops before that went quiet (dead, hung, or done);
# - lines without a rank prefix that show progress after the complaints (a progress bar, a step
#   line) belong to the one rank the logs show nothing else of, when there is exactly one: the
#   ranks that complained are failing by then, not training.
# "After" is read, in one input, from the line order (one console, one clock); across inputs, from
# timestamps, with a margin for hosts whose clocks differ.

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from distdoctor.explain.ranks import RankCollector, RankText
from distdoctor.explain.sanitize import clean_quote

# Clocks of two hosts can differ by this much without anyone noticing; a later timestamp from another
# file counts only beyond it.
CLOCK_MARGIN_S = 120.0
MAX_QUOTE = 160


@dataclass(frozen=True)
class Complaint:
    """Where a rank first reported a timeout or a lost peer."""

    rank: int
    where: tuple[int, int]          # (input index, line)
    time: float | None              # epoch seconds, when the line had a timestamp


def complaints(collector: RankCollector, consequence_errors: dict[int, tuple[tuple[int, int], float | None]],
               to_time: Callable[[str | None], float | None]) -> list[Complaint]:
    """Every rank's first complaint: NCCL's watchdog lines, and errors that are a peer's consequence."""
    found: dict[int, Complaint] = {}
    for rank, text in collector.ranks.items():
        if text.complained is not None:
            found[rank] = Complaint(rank, text.complained, to_time(text.complained_time))
    for rank, (where, when) in consequence_errors.items():
        current = found.get(rank)
        if current is None or where < current.where:
            found[rank] = Complaint(rank, where, when if when is not None else (current.time if current else None))
    return list(found.values())


def kept_going(text: RankText, complained: Iterable[Complaint],
               to_time: Callable[[str | None], float | None]) -> str | None:
    """The line that shows this rank at work after its peers first complained, or None."""
    others = [c for c in complained if c.rank != text.rank]
    if not others or text.last_seen is None:
        return None
    same_input = [c.where for c in others if c.where[0] == text.last_seen[0]]
    if same_input and text.last_seen > min(same_input):
        return _quote(text.last_seen_text)
    last = to_time(text.last_time)
    first = min((c.time for c in others if c.time is not None), default=None)
    if last is not None and first is not None and last > first + CLOCK_MARGIN_S:
        return _quote(text.last_seen_text)
    return None


def went_quiet_first(text: RankText, complained: Iterable[Complaint]) -> bool:
    """Its output (in the same input) stopped before any peer complained."""
    others = [c.where for c in complained if c.rank != text.rank and text.last_seen is not None
              and c.where[0] == text.last_seen[0]]
    return bool(others) and text.last_seen is not None and text.last_seen < min(others)


def anonymous_progress(collector: RankCollector, complained: Iterable[Complaint]) -> str | None:
    """A progress line without a rank prefix printed after the first complaint in the same input."""
    first: dict[int, tuple[int, int]] = {}
    for c in complained:
        first[c.where[0]] = min(first.get(c.where[0], c.where), c.where)
    for index, (line, _, text) in sorted(collector.anonymous.items()):
        if index in first and (index, line) > first[index]:
            return _quote(text)
    return None


def implied_ranks(seen: set[int]) -> set[int]:
    """Ranks the logs must have had though none of their lines shows them: rank 0 of any job, and a few
    gaps below the highest rank seen. A larger gap is another node's logs not given (ranks 8-15 alone
    say nothing of 0-7)."""
    if not seen:
        return set()
    top = max(seen)
    absent = set(range(top)) - seen
    return absent if 0 < len(absent) <= max(1, (top + 1) // 4) else set()


def _quote(text: str) -> str:
    return clean_quote(text.strip()[-MAX_QUOTE:])
