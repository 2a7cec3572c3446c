"""Integer variables read from the environment: a value, or why it is unusable (never an exception)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class IntVar:
    """An integer variable as read from the environment: its value, or why it is unusable."""

    name: str
    raw: str | None
    value: int | None = None
    problem: str | None = None

    @property
    def present(self) -> bool:
        return self.raw is not None


# The largest rank count a variable may state: far above any real job, and low enough that
# lists over the ranks stay small (torch keeps ranks in C ints; Python's int() has no bound).
MAX_WORLD = 1 << 20
# Longer values are not parsed: no usable rank or port has this many characters.
MAX_INT_TEXT = 32


def read_int(env: Mapping[str, str], name: str, minimum: int | None = 0, maximum: int | None = None) -> IntVar:
    raw = env.get(name)
    if raw is None:
        return IntVar(name, None)
    text = raw.strip()
    shown = raw if len(raw) <= 40 else raw[:40] + "..."
    if len(text) > MAX_INT_TEXT:
        return IntVar(name, raw, problem=f"{name}={shown!r} is not a usable integer ({len(text)} characters)")
    try:
        # ASCII digits only: int() also takes other scripts' digits, and "²".isdigit() is True.
        if not text.lstrip("+-").isascii():
            raise ValueError(text)
        value = int(text, 10)
    except ValueError:
        return IntVar(name, raw, problem=f"{name}={shown!r} is not an integer")
    if minimum is not None and value < minimum:
        return IntVar(name, raw, problem=f"{name}={shown!r} is below {minimum}")
    if maximum is not None and value > maximum:
        return IntVar(name, raw, problem=f"{name}={shown!r} is above {maximum}")
    return IntVar(name, raw, value=value)
