"""Logs that stop with no error anywhere where a job waits: inside a collective's frames, or right after NCCL's start-up."""

# A stack printed while a job hung (py-spy dump, faulthandler's dump_traceback, a debugger's `where`) with a
# frame in barrier / all_reduce / ... and no line that looks like an error nor a Python traceback (those are
# read as what they raised): the rank waited in a collective that never completed. NCCL's watchdog reports
# the same wait when it fires, so the causes are the watchdog timeout's, in the order its labelled threads
# give (family nccl_watchdog_timeout), and the finding says that only the other ranks' stacks tell them apart.
#
# NCCL's start-up lines (NCCL_DEBUG=INFO's bootstrap, rings and "Init COMPLETE", or nccl-tests' header) and
# then nothing: the job hangs in NCCL's set-up or its first collective, where the transport between the GPUs
# or the hosts is first used. No labelled family counts this, so the order is NCCL's troubleshooting order:
# peer-to-peer traffic blocked (IOMMU/ACS, a VM) first, then the network between hosts (left out when the logs
# show one host), then a peer that never came, then mixed builds.

from __future__ import annotations

import re

from distdoctor.core.findings import Finding
from distdoctor.explain.candidates import BETWEEN_HOSTS, describe, rank_family
from distdoctor.explain.catalog import Catalog
from distdoctor.explain.scan import Accumulator

CUE = "ctx_in_collective"
FAMILY = "nccl_watchdog_timeout"
CONFIDENCE_CAP = 0.5
STARTED_CUE, RESULTS_CUE = "ctx_nccl_started", "ctx_nccl_results"
STARTED_CAP = 0.4
_OP = re.compile(r"\bin (?P<op>\w{1,40})\s*$|(?P<pyspy>\w{1,40}) \(")

# (cause, hand-set confidence, why, tell): the watchdog timeout's candidates, for a wait no timeout ended yet.
HUNG = [
    ("straggler_rank", 0.3, "one rank was busy elsewhere (data loading, evaluation or a checkpoint on rank 0) and "
     "had not reached the collective", "that rank's stack is outside torch.distributed (in its own code or I/O)"),
    ("rank_missing", 0.3, "a rank crashed, was killed or hung before issuing the collective",
     "a rank whose log stops early or that is gone; torchrun's summary or dmesg for a killed process"),
    ("collective_mismatch", 0.2, "the ranks are waiting in different collectives (a code path taken on some ranks "
     "only), so none completes", "the other ranks' stacks stop in a different collective or line; "
     "TORCH_DISTRIBUTED_DEBUG=DETAIL names it"),
    ("uneven_inputs", 0.15, "a rank ran out of batches and stopped calling collectives",
     "the ranks' last step numbers differ; len(dataloader) differs between ranks"),
    ("oom_killed_rank", 0.1, "a peer was killed by the OOM killer (host memory) and never reached the collective",
     "dmesg -T | grep -i 'killed process' on the peers' hosts"),
    ("p2p_blocked", 0.1, "GPU peer-to-peer traffic is blocked (IOMMU/ACS, a VM), so NCCL hangs in its first "
     "collectives", "the hang is in the first collective after init and goes away with NCCL_P2P_DISABLE=1"),
]


def stopped_in_collective(found: Finding, acc: Accumulator, catalog: Catalog) -> Finding | None:
    """The hang finding for logs that stop in a collective's frames with no error line; None otherwise."""
    entry = acc.cues.get(CUE)
    if entry is None:
        return None
    ranked = rank_family(FAMILY, HUNG, acc, catalog)
    if not ranked:
        return None
    evidence = entry[1]
    match = _OP.search(evidence["text"].rstrip())
    op = (match["op"] or match["pyspy"]) if match else "a collective"
    top = ranked[0]
    detail = [f"No line looks like an error, and the stack stops inside torch.distributed's {op} "
              f"({evidence['file']}:{evidence['line']}): the rank was waiting in a collective that had not completed, "
              "a hang. Every cause below leaves this same stack on the waiting ranks; the other ranks' stacks "
              "(distdoctor stacks on the live job, or py-spy dump --pid on each) tell them apart.",
              *describe(ranked)]
    data = {**found.data, "signature": "stopped_in_collective", "role": "symptom", "family": FAMILY,
            "operation": op, "candidates": [r.to_dict() for r in ranked], "evidence": [evidence]}
    return top.kind(f"The job stopped inside torch.distributed's {op} with no error: a hang"[:300],
                    detail="\n".join(detail), remediation=f"{top.kind.hint}. To confirm: {top.tell}",
                    data=data, check="explain", confidence=min(top.confidence, CONFIDENCE_CAP))


STARTED = [
    ("p2p_blocked", 0.3, "GPU peer-to-peer traffic is blocked (IOMMU/ACS on bare metal, a VM's passthrough), so NCCL's "
     "first transfers between the GPUs never complete",
     "NCCL_P2P_DISABLE=1 lets it through; nccl-tests hang the same way"),
    ("wrong_interface", 0.2, "NCCL picked an interface that does not link the hosts (a docker bridge, a VPN)",
     "NCCL INFO's 'NET/Socket : Using' line; it goes through with NCCL_SOCKET_IFNAME set"),
    ("ib_rdma_issue", 0.15, "InfiniBand/RoCE is set up but does not pass traffic (GID index, a port down)",
     "NCCL_IB_DISABLE=1 lets it through; ibstat / ib_write_bw between the hosts"),
    ("rank_missing", 0.12, "a rank never reached NCCL's init (crashed, not started, fewer processes than the world)",
     "count the ranks' 'Init COMPLETE' lines against the world size; torchrun's summary"),
    ("firewall", 0.1, "a firewall between the hosts lets the bootstrap through but not NCCL's data ports",
     "it goes through with the firewall off or NCCL's port range opened"),
    ("version_incompat", 0.1, "the NCCL, CUDA or driver builds do not fit together on these GPUs",
     "NCCL's version line on every rank; python -m torch.utils.collect_env on each node"),
]


def stopped_after_nccl_init(found: Finding, acc: Accumulator, catalog: Catalog) -> Finding | None:
    """The hang finding for logs whose last word is NCCL's start-up (and no result after it); None otherwise."""
    entry = acc.cues.get(STARTED_CUE)
    if entry is None or RESULTS_CUE in acc.cues:
        return None
    options = [o for o in STARTED if not (acc.one_host and o[0] in BETWEEN_HOSTS)]
    ranked = rank_family("", options, acc, catalog)
    if not ranked:
        return None
    evidence, top = entry[1], ranked[0]
    one_host = (f" These logs show one host ({acc.one_host}): the network between hosts is not at fault."
                if acc.one_host else "")
    detail = [f"NCCL started ({evidence['file']}:{evidence['line']}: {evidence['text']}) and nothing followed: no "
              "error, no result, no step. The job hangs in NCCL's set-up or its first collective." + one_host,
              *describe(ranked)]
    data = {**found.data, "signature": "stopped_after_nccl_init", "role": "symptom", "candidates":
            [r.to_dict() for r in ranked], "evidence": [evidence]}
    return top.kind("NCCL started and the job went silent: a hang in its set-up or first collective",
                    detail="\n".join(detail), remediation=f"{top.kind.hint}. To confirm: {top.tell}",
                    data=data, check="explain", confidence=min(top.confidence, STARTED_CAP))
