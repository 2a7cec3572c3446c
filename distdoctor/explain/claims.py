"""One global rank announced by two processes in one start-up: two nodes started as the same ranks."""

# Lightning prints "Initializing distributed: GLOBAL_RANK: g, MEMBER: g+1/W" once per process as it joins
# the group. A rank announced twice with no failure between the two lines is one start-up in which two
# processes hold that rank: on a cluster, every node started as the first node (its node rank, or SLURM's
# task count, not passed on), and the world's other ranks never come. Whatever failed afterwards (a
# timeout, a collective that never completes) is its consequence. A restart announces every rank again,
# after the failure that caused it: a failure line between the two announcements means a restart. Every
# rank twice and none missing is what a log printed twice (two handlers) or two runs in one file look like.

from __future__ import annotations

from distdoctor.core.findings import Finding
from distdoctor.core.report import format_ranks
from distdoctor.explain.catalog import Catalog
from distdoctor.explain.scan import Accumulator

KIND = "log.E035"  # rank_config_error
CONFIDENCE = 0.8        # the claims twice and the ranks never announced: the log excludes the alternatives
CONFIDENCE_ALONE = 0.6  # twice, but every rank of the world was announced too (two jobs in one log?)


def _restarted_between(source: int, first: int, second: int, failures: list[tuple[int, int]]) -> bool:
    return any(src == source and first < line < second for src, line in failures)


def twice_claimed(acc: Accumulator, failures: list[tuple[int, int]]) -> tuple[list[int], list[int], int] | None:
    """(ranks announced twice in one start-up, ranks of the world never announced, world size), or None.

    failures: (input, line) of every line that looks like a failure or starts a traceback."""
    worlds = {world for *_, world in acc.rank_claims}
    if len(worlds) != 1:
        return None  # no claims, or claims of different worlds (two jobs): nothing to compare
    world = worlds.pop()
    first_seen: dict[int, tuple[int, int]] = {}
    twice: set[int] = set()
    for source, line, rank, _ in acc.rank_claims:
        earlier = first_seen.get(rank)
        if earlier is None:
            first_seen[rank] = (source, line)
        elif earlier[0] != source or not _restarted_between(source, earlier[1], line, failures):
            twice.add(rank)
    never = [r for r in range(world) if r not in first_seen] if world <= 4096 else []
    if not twice or (not never and len(twice) == world):
        return None  # every rank twice and none missing: the job's lines printed twice, or two runs in one file
    return sorted(twice), never, world


def claims_finding(acc: Accumulator, catalog: Catalog, failures: list[tuple[int, int]]) -> Finding | None:
    """The finding for ranks announced twice in one start-up; None when no rank was."""
    found = twice_claimed(acc, failures)
    if found is None:
        return None
    twice, never, world = found
    label = ("rank " if len(twice) == 1 else "ranks ") + format_ranks(twice)
    missing = ("rank " if len(never) == 1 else "ranks ") + format_ranks(never)
    lines = [str(ln) for _, ln, r, _ in acc.rank_claims if r == twice[0]][:2]
    absent = f"; {missing} of the {world} never announced" if never else ""
    detail = [f"Lightning announced {label} of a world of {world} twice, with no failure between the two "
              f"announcements (rank {twice[0]}: lines {', '.join(lines)}){absent}. Two processes held each of those "
              "ranks: on a cluster, each node started as the first node (its node rank, or SLURM's "
              "--ntasks-per-node / --nodes, not passed on), so the group cannot form as asked and what failed "
              "after it is a consequence."]
    kind = catalog.kinds[KIND]
    title = (f"{label.capitalize()} {'was' if len(twice) == 1 else 'were each'} announced by two processes"
             + (f"; {missing} of {world} never" if never else ""))
    return kind(title[:300], detail="\n".join(detail),
                remediation=(f"{kind.hint}. Under SLURM, set --nodes and --ntasks-per-node to the Trainer's "
                             "num_nodes and devices; elsewhere give each node its own NODE_RANK"),
                ranks=twice, data={"signature": "rank_claimed_twice", "role": "cause", "world_size": world,
                                   "claimed_twice": twice, "never_claimed": never},
                check="explain", confidence=CONFIDENCE if never else CONFIDENCE_ALONE)
