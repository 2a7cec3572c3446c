"""How the threads' priors rank the causes of threads they were not counted from:
python tests/explain/priors_figures.py [--part dev|sealed]

For each labelled thread of the part whose family has a catalog signature with candidates, the ranking
explain gives that family from the priors alone (the dev threads' counts smoothed towards the catalog's
order, no log and no cues: priors.py), and whether the thread's cause is first, or among the first three.
On the dev part each thread is left out of the counts it is judged by (leave-one-out), while whether its family
is ranked by counts at all is decided as the shipped explain decides it, on the family's full count (before
issue 45's third round, a 5-thread family fell back to the catalog's order when one thread was left out, which
explain never does: that understated the dev figure); the sealed part is never counted, so it is judged against
all dev threads. The sealed figure is taken once, when a piece of
work is done (docs/explain.md).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def family_bases() -> dict[str, dict[str, float]]:
    """Per family, the catalog's hand-set order of the first signature of that family that has candidates."""
    from distdoctor.explain import CATALOG

    bases: dict[str, dict[str, float]] = {}
    for sig in CATALOG.signatures:
        if sig.family and sig.candidates and sig.family not in bases:
            bases[sig.family] = {sig.cause: sig.confidence, **{c.kind.cause: c.confidence for c in sig.candidates}}
    return bases


def evaluate(part: str) -> list[tuple[str, str, list[str]]]:
    from distdoctor.explain.priors import MIN_FAMILY_THREADS, THREADS_PATH, count, parse_threads

    threads = parse_threads(tomllib.loads(THREADS_PATH.read_text()))
    full = count(threads)
    bases = family_bases()
    judged = [t for t in threads if t.part == part and t.cause != "unknown" and t.signature in bases]
    out = []
    for t in judged:
        counted = [u for u in threads if u is not t]
        base = bases[t.signature]
        ranked_by_counts = full.family_threads(t.signature) >= MIN_FAMILY_THREADS
        posterior = count(counted).posterior(t.signature, base, 0 if ranked_by_counts else 1 << 30) or base
        ranked = sorted(posterior, key=lambda c: -posterior[c])
        out.append((t.signature, t.cause, ranked))
    return out


def main() -> None:
    sys.path.insert(0, str(REPO))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("dev", "sealed"), default="dev")
    args = parser.parse_args()
    rows = evaluate(args.part)
    top1 = sum(ranked[:1] == [cause] for _, cause, ranked in rows)
    top3 = sum(cause in ranked[:3] for _, cause, ranked in rows)
    catalog_top3 = sum(cause in sorted(family_bases()[fam], key=lambda c: -family_bases()[fam][c])[:3]
                       for fam, cause, _ in rows)
    n = max(1, len(rows))
    print(f"{args.part}: {len(rows)} labelled threads of families with candidates; the priors' first answer "
          f"right {top1 / n:.0%} ({top1}), the cause in their top 3 {top3 / n:.0%} ({top3}); the catalog's "
          f"hand-set order alone: top 3 {catalog_top3 / n:.0%} ({catalog_top3})")


if __name__ == "__main__":
    main()
