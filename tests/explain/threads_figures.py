"""Per-signature cause counts of the labelled thread set's dev part: python tests/explain/threads_figures.py [--part dev|sealed|all]"""

# distdoctor/explain/threads.toml records, for real public threads of torch.distributed failures,
# the signature the posted log shows and the cause the thread established. The dev part's counts are
# the table explain's candidate priors come from; the sealed part is only counted for its size here
# (its per-signature table is printed only when asked for with --part sealed, by whoever measures).
# Threads whose cause was never established ("unknown") are counted apart, never into a cause.

from __future__ import annotations

import argparse
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

THREADS = Path(__file__).resolve().parents[2] / "distdoctor" / "explain" / "threads.toml"


def threads(part: str = "all") -> list[dict]:
    rows = tomllib.loads(THREADS.read_text())["thread"]
    return [t for t in rows if part == "all" or t["part"] == part]


def cause_counts(rows: list[dict]) -> dict[str, Counter]:
    """signature -> Counter(cause -> threads), unknown causes left out."""
    table: dict[str, Counter] = defaultdict(Counter)
    for t in rows:
        if t["cause"] != "unknown":
            table[t["signature"]][t["cause"]] += 1
    return dict(table)


def report_text(part: str) -> str:
    rows = threads(part)
    labelled = [t for t in rows if t["cause"] != "unknown"]
    lines = [f"{part}: {len(rows)} threads, {len(labelled)} labelled, {len(rows) - len(labelled)} unknown"]
    unknown = Counter(t["signature"] for t in rows if t["cause"] == "unknown")
    table = cause_counts(rows)
    for signature in sorted(set(table) | set(unknown), key=lambda s: (-sum(table.get(s, Counter()).values()), s)):
        counts = table.get(signature, Counter())
        causes = ", ".join(f"{c} {n}" for c, n in counts.most_common())
        lines.append(f"  {signature:<22} {sum(counts.values()):>3} labelled, {unknown[signature]:>2} unknown: {causes}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--part", choices=("dev", "sealed", "all"), default="dev")
    args = parser.parse_args()
    print(report_text(args.part))
    if args.part == "dev":
        for part in ("sealed", "all"):
            rows = threads(part)
            print(f"{part}: {len(rows)} threads, {sum(t['cause'] != 'unknown' for t in rows)} labelled")


if __name__ == "__main__":
    main()
