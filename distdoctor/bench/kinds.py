"""The finding kinds of `distdoctor bench` (documented in docs/findings/bench.md)."""

from __future__ import annotations

from distdoctor.core.registry import finding_kind

SLOW_HOST = finding_kind(
    "bench.W001",
    cause="slow_link",
    title="Every link of one host (or rank) is much slower than its peers'",
    hint="Check that host's NIC speed (ethtool), cabling and interface choice; every collective runs at its pace",
)
SLOW_LINK = finding_kind(
    "bench.W002",
    cause="slow_link",
    title="A link between two hosts (or two ranks) is much slower than its peers",
    hint="Check the route and switch ports between the two named hosts; compare with `distdoctor bench` after a fix",
)
WRONG_INTERFACE = finding_kind(
    "bench.W003",
    cause="wrong_interface",
    title="Traffic to another host leaves through a bridge, loopback or a slow management port",
    hint="Set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to the fabric's interface on every rank",
)
WRONG_RESULT = finding_kind(
    "bench.E001",
    cause="unknown",
    title="A collective returned a wrong result",
    hint="Re-run with one backend setting changed at a time (NCCL_PROTO, NCCL_ALGO, another transport) and report it",
)
NO_WORLD = finding_kind(
    "bench.E002",
    cause="unknown",
    title="The bench world did not form",
    hint="Run `distdoctor check` with the same set-up: it names the cause",
)
BENCH_STOPPED = finding_kind(
    "bench.E003",
    cause="collective_timeout_hang",
    title="The bench stopped before every figure was measured",
    hint="A rank failed or the deadline came first: see the detail; raise --timeout only if the world is merely slow",
)
REGRESSION = finding_kind(
    "bench.E004",
    cause="slow_link",
    title="Bandwidth or latency regressed against the baseline",
    hint="Compare the two runs' interfaces and host pairs; a regression on every size points at a link, not the code",
)
RANKS_MISSING = finding_kind(
    "bench.E005",
    cause="rank_missing",
    title="Ranks never joined the bench before the deadline",
    hint="Start every rank (same --world-size, MASTER_ADDR and MASTER_PORT), or run `distdoctor check` to see why",
)
OP_UNSUPPORTED = finding_kind(
    "bench.I006",
    cause="unknown",
    title="A collective this torch's backend cannot run was left out of the sweep",
    hint="Nothing is wrong with the job's set-up; a newer torch runs it (torch 2.1's gloo has no reduce_scatter)",
)
