"""Finding kinds only the world emits: the store could not be reached or hosted, rank 0 never decided, a store entry was malformed."""

from __future__ import annotations

from distdoctor.core.registry import finding_kind

STORE_UNREACHABLE = finding_kind(
    "rdzv.C001",
    cause="master_unreachable",
    title="This rank could not reach the rendezvous store",
    hint="Check MASTER_ADDR/MASTER_PORT on every rank and that rank 0 (or the launcher) is running and reachable",
)
NO_DECISION = finding_kind(
    "rdzv.E002",
    cause="rank_missing",
    title="Rank 0 did not publish the outcome of the check-in before this rank's deadline",
    hint="Rank 0 did not finish its rendezvous stage: see rank 0's output, or raise --timeout if it is merely slow",
)
STORE_PORT_TAKEN = finding_kind(
    "rdzv.C003",
    cause="port_in_use",
    title="Rank 0 could not host the rendezvous store: MASTER_PORT is taken",
    hint="Pick a free MASTER_PORT (the same on every rank), or stop the process that holds it",
)
RANK_DIED = finding_kind(
    "rdzv.E016",
    cause="unknown",
    title="A rank of the self-test world ended without a report",
    hint="Run the self-test again with --all-ranks; a rank killed by signal 9 points at the OOM killer (dmesg)",
)
MASTER_NOT_HERE = finding_kind(
    "rdzv.C017",
    cause="master_unreachable",
    title="MASTER_ADDR is not an address of rank 0's host and does not lead to it",
    hint="Run rank 0 on the host MASTER_ADDR names, or set MASTER_ADDR (on every rank) to rank 0's host address",
)
STORE_HOST_FAILED = finding_kind(
    "rdzv.C018",
    cause="unknown",
    title="Rank 0 could not host the rendezvous store",
    hint="Read the error in the detail; it is neither a taken port nor an address of another host",
)
STORE_DROPPED = finding_kind(
    "rdzv.C019",
    cause="firewall",
    title="Connections to the rendezvous store time out: packets are dropped",
    hint="Open MASTER_PORT (and the backend's ports) between the nodes: firewall, security group, network policy",
)
STORE_ENTRY_MALFORMED = finding_kind(
    "rdzv.W020",
    cause="unknown",
    title="An entry in the rendezvous store was malformed: a foreign or corrupted writer",
    hint="Something other than this job's distdoctor wrote to the store: look for other processes that connect to MASTER_PORT (ss -tnp 'dport = :PORT'), or run with a MASTER_PORT of its own",
)
NATIVE_OUTPUT = finding_kind(
    "coll.I009",
    cause="unknown",
    title="torch's C++ layer wrote diagnostics on distdoctor's own ranks (kept off the terminal)",
    hint="Nothing to do when no other finding names a fault; beside one, these lines are its evidence",
)
