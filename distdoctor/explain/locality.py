"""Whether the logs show a job that ran on one host, where no network between hosts can be at fault."""

# A refused or timed-out connection between ranks on one host is never the interface, a firewall or
# InfiniBand: every address is the host's own. The logs prove one host in two ways:
# - they say so: torchrun --standalone, a rendezvous endpoint or MASTER_ADDR on loopback (an address
#   only this host can reach: if the ranks met there, they all run here), a rendezvous of one node
#   (the agent's group_world_size=1) — the catalog's `ctx_one_host` cue;
# - they count it: the world's size (Gloo's "rank=R, size=N", a rank's world_size=N) and torchrun's
#   summary putting ranks 0..N-1 on the same host.
# Without either, nothing is assumed: a multi-host job whose ranks published loopback addresses looks
# the same in one node's console, and there the interface is the cause.

from __future__ import annotations

import re

from distdoctor.explain.ranks import RankCollector
from distdoctor.explain.scan import Accumulator

_GLOO_SIZE = re.compile(r"\brank=\d{1,7}, size=(\d{1,7})\b")
MAX_WORLD = 4096  # beyond this a summary cannot list every rank anyway


def one_host(acc: Accumulator, collector: RankCollector) -> str:
    """Why these logs show a job on one host ("" when they do not show it)."""
    said = acc.cues.get("ctx_one_host")
    if said is not None:
        evidence = said[1]
        return f"{evidence['file']}:{evidence['line']}: {evidence['text']}"
    size = _world_size(acc, collector)
    if size is None or not 1 < size <= MAX_WORLD:
        return ""
    hosts = set()
    for rank in range(size):
        text = collector.ranks.get(rank)
        if text is None or text.exit is None or not text.exit.host:
            return ""
        hosts.add(text.exit.host)
    if len(hosts) != 1:
        return ""
    return f"the world has {size} ranks and torchrun's summary puts all of them on {hosts.pop()}"


def _world_size(acc: Accumulator, collector: RankCollector) -> int | None:
    sizes = {n for text in collector.ranks.values() for n in text.world_sizes}
    for group in acc.groups.values():
        for evidence in group.evidence:
            sizes.update(int(m) for m in _GLOO_SIZE.findall(evidence["text"]))
    return sizes.pop() if len(sizes) == 1 else None
