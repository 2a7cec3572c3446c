"""The words a block holds, found once by the scan: a longer text holding one of them is not searched where it is absent."""

# Every block is searched for the relevance words anyway (scan._find_relevance, on its lower-case
# copy). A text the rank collector or the attempts' marks look for ("Traceback (most recent call
# last)", "exitcode  : ", "ChildFailedError") that holds one of those words cannot be in a block
# without it: one set lookup instead of a pass over a megabyte. A text that holds none of them is
# searched as before. Words only this module needs ("restart", "orld") are looked for with `in`,
# which stops at the first one.

from __future__ import annotations

PRESENCE_ONLY = ("restart", "orld")
_WORD_OF: dict[tuple[str, tuple[str, ...]], str | None] = {}


class BlockWords:
    """Which of the tracked (lower-case) words one block holds, case aside."""

    def __init__(self, found: set[str], tracked: tuple[str, ...]) -> None:
        self.found, self.tracked = found, tracked

    def may_hold(self, text: str) -> bool:
        """False only when ``text`` cannot be in the block: it holds a tracked word the block lacks."""
        key = (text, self.tracked)
        word = _WORD_OF.get(key, "")
        if word == "":
            lowered = text.lower()
            word = _WORD_OF[key] = next((w for w in self.tracked if w in lowered), None)
        return word is None or word in self.found


def may_hold(words: BlockWords | None, text: str) -> bool:
    """BlockWords.may_hold, True without them (a block searched the plain way)."""
    return words is None or words.may_hold(text)
