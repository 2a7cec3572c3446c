"""Ranks said as ranges, grouped by what they share (a state, a place), within a line budget."""

# A report must read the same at 4 ranks and at 4,096: "ranks 0-31, 33-4095 wait in all_reduce
# #12; rank 32 is outside it at train.py:41", never four thousand numbers or one line per rank.
# Everything that writes ranks into text (titles, details, `where`, the renderers) goes through
# here: ranks as ranges with a bound on how many ranges one text holds, ranks grouped by a key
# (what they do and where), the groups said within a budget of lines with the odd ones (the
# small groups) kept and the rest counted. The JSON keeps every rank (as_ranges: [lo, hi] pairs).

from __future__ import annotations

import re
from typing import Callable, Hashable, Iterable, Mapping, Sequence, TypeVar

K = TypeVar("K", bound=Hashable)

# Ranges one text holds: "0, 2, 4, …, 4094 (2048 ranks)" past it.
MAX_RANGES = 12
# Lines one list of groups takes: a 4,096-rank job's states in as many lines as a 4-rank job's.
MAX_LINES = 8
# Hosts named in one text: "node-000, node-001, …, node-511 (512 hosts)" past it.
MAX_HOSTS = 4


def as_ranges(ranks: Iterable[int]) -> list[list[int]]:
    """[0, 1, 2, 3, 5, 7, 8] -> [[0, 3], [5, 5], [7, 8]]: every rank, compactly (for JSON)."""
    ordered = sorted(set(int(r) for r in ranks))
    out: list[list[int]] = []
    for rank in ordered:
        if out and rank == out[-1][1] + 1:
            out[-1][1] = rank
        else:
            out.append([rank, rank])
    return out


def _range_text(pair: Sequence[int]) -> str:
    return str(pair[0]) if pair[0] == pair[1] else f"{pair[0]}-{pair[1]}"


def ranges_text(ranks: Iterable[int], limit: int | None = MAX_RANGES) -> str:
    """[0, 1, 2, 3, 5, 7, 8] -> '0-3, 5, 7-8'; past ``limit`` ranges the first ones, an ellipsis,
    the last one and the count: '0, 2, 4, …, 4094 (2048 ranks)' (None: every range)."""
    pairs = as_ranges(ranks)
    if limit is None or len(pairs) <= max(limit, 2):
        return ", ".join(_range_text(p) for p in pairs)
    count = sum(hi - lo + 1 for lo, hi in pairs)
    head = ", ".join(_range_text(p) for p in pairs[:max(limit, 2) - 1])
    return f"{head}, …, {_range_text(pairs[-1])} ({count} ranks)"


def ranks_label(ranks: Iterable[int], *, capital: bool = False, limit: int | None = MAX_RANGES) -> str:
    """'rank 3' / 'ranks 0-31, 33-4095' ('Rank' / 'Ranks' with capital)."""
    ranks = sorted(set(ranks))
    word = ("R" if capital else "r") + ("ank" if len(ranks) == 1 else "anks")
    return f"{word} {ranges_text(ranks, limit)}"


def hosts_text(hosts: Iterable[str], limit: int = MAX_HOSTS, *, count: bool = True) -> str:
    """'node-a, node-b'; past ``limit`` hosts: 'node-000, node-001, node-002, …, node-511 (512 hosts)'
    (without the count when the caller says it)."""
    names = list(dict.fromkeys(str(h) for h in hosts))
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[:max(limit - 1, 1)]) + f", …, {names[-1]}" + (f" ({len(names)} hosts)" if count else "")


def group_ranks(items: Iterable[tuple[int, K]]) -> list[tuple[K, list[int]]]:
    """(rank, key) pairs -> [(key, its ranks sorted)], in the order of each group's lowest rank."""
    groups: dict[K, list[int]] = {}
    for rank, key in items:
        groups.setdefault(key, []).append(int(rank))
    return sorted(((k, sorted(set(r))) for k, r in groups.items()), key=lambda g: g[1][0] if g[1] else -1)


def within_budget(groups: Sequence[tuple[K, list[int]]], budget: int = MAX_LINES) -> tuple[list[tuple[K, list[int]]], list[int]]:
    """The groups to say within ``budget`` lines (one is kept for the rest's count) and the ranks of
    the groups left out. The largest group is always said (what most ranks do), then the smallest
    (the odd ones, where to look first); what is said keeps the groups' rank order."""
    if len(groups) <= budget:
        return list(groups), []
    order = sorted(range(len(groups)), key=lambda i: len(groups[i][1]))
    keep = {order[-1], *order[:max(budget - 2, 0)]}
    said = [g for i, g in enumerate(groups) if i in keep]
    rest = sorted(r for i, g in enumerate(groups) if i not in keep for r in g[1])
    return said, rest


def grouped_lines(groups: Sequence[tuple[K, list[int]]], say: Callable[[K, list[int]], str], *,
                  budget: int = MAX_LINES, rest: str = "in other states") -> list[str]:
    """One line per group (``say(key, ranks)``), within ``budget`` lines: past it the largest and
    the odd groups are said and one line counts the others ('… and 37 more ranks in other states:
    …')."""
    said, left = within_budget(groups, budget)
    lines = [say(key, ranks) for key, ranks in said]
    if left:
        lines.append(f"… and {len(left)} more {'rank' if len(left) == 1 else 'ranks'} ({ranges_text(left)}) {rest}"
                     " (--format json lists every rank)")
    return lines


def said_alike(items: Iterable[tuple[int, str]], say: Callable[[str, str, list[int]], str], *,
               budget: int = MAX_LINES, rest: str = "in other states") -> list[str]:
    """(rank, text) pairs -> lines, ranks whose texts differ only in numbers (a port, a time) said
    once as ranges with the first one's text (``say(label, text, ranks)``; 'ranks 1-1023 failed
    with ... (rank 1's words; the others' differ only in numbers)'), within ``budget`` lines."""
    items = list(items)
    # A few ranks are each said with their own words; only many are grouped by shape.
    key_of = (lambda text: text) if len(items) <= budget else shape
    first: dict[str, tuple[int, str]] = {}
    alike: dict[str, bool] = {}
    keyed = []
    for rank, text in items:
        key = key_of(text)
        if key not in first:
            first[key], alike[key] = (rank, text), True
        alike[key] = alike[key] and text == first[key][1]
        keyed.append((rank, key))

    def said(key: str, ranks: list[int]) -> str:
        owner, text = first[key]
        line = say(ranks_label(ranks), text, ranks)
        return line if alike[key] else f"{line} (rank {owner}'s words; the others' differ only in numbers)"

    return grouped_lines(group_ranks(keyed), said, budget=budget, rest=rest)


def where_text(per_host: Mapping[str, Iterable[int]], budget: int = MAX_HOSTS) -> str:
    """Ranks per host: 'ranks 0-7 on node-a; rank 8 on node-b'; past ``budget`` hosts the hosts
    that hold the same ranks' pattern are not listed one by one: 'ranks 0-4095 on 512 hosts
    (node-000, node-001, node-002, …, node-511)'."""
    chunks = sorted(((str(h), sorted(set(int(r) for r in rs))) for h, rs in per_host.items()),
                    key=lambda kv: kv[1][0] if kv[1] else -1)
    if len(chunks) <= budget:
        return "; ".join(f"{ranks_label(r)} on {h}" if r else f"on {h}" for h, r in chunks)
    everyone = [r for _, rs in chunks for r in rs]
    return f"{ranks_label(everyone)} on {len(chunks)} hosts ({hosts_text([h for h, _ in chunks], count=False)})"


_NUMBER = re.compile(r"\d+(\.\d+)?")


def shape(text: str) -> str:
    """The text with its numbers masked: messages that differ only in a port, a rank or a time
    ('Connection closed by peer [10.0.0.7]:4213') fall in one group."""
    return _NUMBER.sub("#", text)
