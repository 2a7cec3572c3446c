"""torch < 2.0's DETAIL check: each rank raised with its own fingerprint; the ranks' lines compared name what differs."""

# TORCH_DISTRIBUTED_DEBUG=DETAIL in torch 1.9-1.13 (ProcessGroupWrapper.cpp) raised on every rank "Detected
# mismatch between collectives on ranks. Rank N is running inconsistent collective: CollectiveFingerPrint(
# OpType=..., TensorShape=[...], TensorDtypes=...": the rank's own fingerprint, never the other's. One such
# line cannot tell a different collective from a different shape or dtype; the lines of two ranks can.

from __future__ import annotations

from distdoctor.core.findings import Finding
from distdoctor.core.report import format_ranks
from distdoctor.explain.catalog import Catalog
from distdoctor.explain.scan import Group

SIGNATURE = "detail_fingerprint_of_rank"
CONFIDENCE = 0.9
# Which aspect differs -> (finding kind, what the title says).
ASPECTS = {"op": ("log.E018", "different collectives"), "shape": ("log.E016", "one collective with different shapes"),
           "dtype": ("log.E017", "one collective with different dtypes")}


def _fingerprints(group: Group) -> dict[str, tuple[str, str, str]]:
    """Per rank its (op, shape, dtype) as its own line printed it."""
    found: dict[str, tuple[str, str, str]] = {}
    for entry in group.evidence:
        match = group.signature.regex.search(entry["text"])
        if match is not None:
            found.setdefault(match["rank_a"], (match["op_a"], match["fp_a"] or "", match["dtype_a"] or ""))
    return found


def _aspect(prints: dict[str, tuple[str, str, str]]) -> str | None:
    for index, aspect in enumerate(("op", "shape", "dtype")):
        if len({p[index] for p in prints.values()}) > 1:
            return aspect
    return None


def compared_fingerprints(group: Group, catalog: Catalog) -> Finding | None:
    """The finding two ranks' fingerprints make together; None when the lines do not show a difference."""
    prints = _fingerprints(group)
    aspect = _aspect(prints) if len(prints) > 1 else None
    if aspect is None:
        return None
    kind_id, what = ASPECTS[aspect]
    index = ("op", "shape", "dtype").index(aspect)
    per_rank = "; ".join(f"rank {rank}: {p[0]}" + (f" [{p[1]}]" if aspect != "op" and p[1] else "")
                         + (f" {p[2]}" if aspect == "dtype" else "") for rank, p in sorted(prints.items()))
    values = sorted({f"[{p[index]}]" if aspect == "shape" else p[index] for p in prints.values()})
    ranks = {int(r) for r in prints}
    detail = [f"TORCH_DISTRIBUTED_DEBUG=DETAIL raised on {len(prints)} ranks, each with its own fingerprint; compared, "
              f"they differ in the {'collective' if aspect == 'op' else aspect}: {per_rank}."]
    detail += [f"  {e['file']}:{e['line']}: {e['text']}" for e in group.evidence[:3]]
    return catalog.kinds[kind_id](
        f"Ranks {format_ranks(ranks)} called {what}: {' vs '.join(values)}"[:300],
        detail="\n".join(detail),
        remediation=f"{catalog.kinds[kind_id].hint}. The ranks' fingerprints: {per_rank}."[:600],
        ranks=ranks, hosts=group.hosts,
        data={"signature": SIGNATURE, "role": "cause", "aspect": aspect, "fingerprints": prints,
              "evidence": list(group.evidence)},
        check="explain", confidence=CONFIDENCE,
    )
