"""Integers read the way torch's C++ reads them from the environment.

std::stoi and torch's _strtoul both take the leading (optionally signed) digits and ignore the
rest, so "30abc" is 30 to torch. distdoctor must read a value exactly as torch will.
"""

from __future__ import annotations


def leading_int(text: str) -> int | None:
    """The leading optionally signed digits of ``text`` as an int; None when there are none."""
    digits = ""
    for i, ch in enumerate(text):
        if ch.isdigit() or (i == 0 and ch in "+-"):
            digits += ch
        else:
            break
    try:
        return int(digits)
    except ValueError:
        return None
