"""The link matrix's schedule: every pair of ranks exactly once, in O(n) rounds of disjoint pairs."""

from __future__ import annotations


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """The circle method of a round-robin tournament: n-1 rounds (n even) or n rounds (n odd).

    Rank 0 stays put while the others rotate one place per round; with an odd n a phantom
    player is added and whoever meets it sits the round out. Each pair is (lower, higher).
    """
    if n < 2:
        return []
    players: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    rounds: list[list[tuple[int, int]]] = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = players[i], players[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def partner_in(round_pairs: list[tuple[int, int]], rank: int) -> tuple[int | None, bool]:
    """This rank's partner in a round and whether it leads the pair (the lower rank leads)."""
    for a, b in round_pairs:
        if rank == a:
            return b, True
        if rank == b:
            return a, False
    return None, False
