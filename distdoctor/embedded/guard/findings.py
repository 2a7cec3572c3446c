"""The guard's finding kinds, and the diagnosis of a mismatch or a hang from every rank's calls."""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping

from distdoctor.embedded.guard.record import CallRecord
from distdoctor.core.findings import Finding
from distdoctor.core.registry import finding_kind

CHECK = "guard"

SHAPE = finding_kind("guard.E001", cause="shape_mismatch", title="Ranks called one collective with different tensor shapes",
                     hint="Make every rank pass a tensor of the same shape to this call (print tensor.shape on each rank at the named lines)")
DTYPE = finding_kind("guard.E002", cause="dtype_mismatch", title="Ranks called one collective with different dtypes",
                     hint="Convert to one dtype before the call on every rank (tensor.to(torch.float32)); check the .to()/.half() calls on the named lines")
DEVICE = finding_kind("guard.E003", cause="device_mismatch", title="Ranks called one collective with tensors on different device types",
                      hint="Move the tensor to the same device type on every rank before the call (tensor.to(device))")
ORDER = finding_kind("guard.E004", cause="collective_mismatch", title="Ranks issued different collectives at one sequence number",
                     hint="Every rank must issue the same collectives, with the same root and reduce op, in the same order; look for rank-dependent branches around the named lines")
UNEVEN = finding_kind("guard.E005", cause="uneven_inputs", title="A rank left the loop of collectives the others are still in",
                      hint="Give every rank the same number of steps: DistributedSampler(drop_last=True), a fixed step count, or torch.distributed.algorithms.Join")
DROPPED = finding_kind("guard.E009", cause="collective_timeout_hang", title="A point-to-point Work was dropped without wait()",
                       hint="Keep the Work that isend/irecv/batch_isend_irecv return and call .wait() on it before using the tensor or exiting")
BLIND = finding_kind("guard.I011", cause="unknown", title="The guard sees only part of the job: what it cannot count, and why",
                     hint="For DDP's and FSDP's collectives: leave TORCH_FR_BUFFER_SIZE unset or > 0 on a torch with the flight recorder; for the cross-rank view: a TCPStore (env://, tcp://, torchrun)")
FAULT = finding_kind("guard.W012", cause="unknown", title="A fault of the guard's own; the guard stays on",
                     hint="The guard goes on watching the job; report this line (and the rank's log) to distdoctor's maintainers")
LEAK = finding_kind("guard.W013", cause="collective_timeout_hang", title="A send was dropped without wait() and no receive waits for it",
                    hint="Keep the Work that isend/batch_isend_irecv return and call .wait() on it; a send nobody receives is a leak, and on gloo a receive posted for it later never completes")
PENDING = finding_kind("guard.W010", cause="collective_timeout_hang", title="A point-to-point Work was still pending at shutdown",
                       hint="Call .wait() on every Work from isend/irecv before destroy_process_group or exit; an unmatched send or recv hangs here")


def group_label(group: str, ranks: Iterable[int] | None = None) -> str:
    if group in ("0", "default", "WORLD"):
        return "the default group"
    members = list(ranks or ())
    return f"group {group}" + (f" (ranks {', '.join(map(str, members))})" if members else "")


def _calls_detail(calls: Mapping[int, CallRecord]) -> str:
    return "\n".join(f"rank {r}: {calls[r].summary()}" for r in sorted(calls))


def _odd_ranks(values: Mapping[int, Any]) -> list[int]:
    """The ranks whose value is not the most common one (ties: not rank-lowest's value)."""
    counts = Counter(repr(v) for v in values.values())
    lowest = repr(values[min(values)])
    top = max(counts.values())
    majority = lowest if counts[lowest] == top else next(k for k, n in counts.items() if n == top)
    return sorted(r for r, v in values.items() if repr(v) != majority)


def _left_loop(calls: Mapping[int, CallRecord], recent: Mapping[int, list[str]]) -> list[int]:
    """Ranks that called from a new line while the others repeat a line these ranks used before.

    That is a loop some ranks left (fewer batches) while others go on: uneven inputs, not a
    random reordering of collectives.
    """
    sites = {r: c.site for r, c in calls.items()}
    looping = {r for r, c in calls.items() if recent.get(r) and recent[r][-1] == c.site}
    left = []
    for rank, call in calls.items():
        if rank in looping:
            continue
        loop_sites = {sites[o] for o in looping}
        if loop_sites and any(s in recent.get(rank, ()) for s in loop_sites):
            left.append(rank)
    return sorted(left) if looping and left else []


def _field_text(field: str, record: CallRecord) -> str:
    if field == "shapes":
        return ", ".join(str(list(s)) for s in record.shapes) or "no tensor"
    if field == "params":
        return ", ".join(f"{k} {v}" for k, v in sorted(record.params.items())) or "no arguments"
    return ", ".join(getattr(record, field)) or "none"


_FIELD_KINDS = {"shapes": (SHAPE, "shapes"), "dtypes": (DTYPE, "dtypes"), "devices": (DEVICE, "device types"),
                "params": (ORDER, "arguments")}


def mismatch_findings(calls: Mapping[int, CallRecord], recent: Mapping[int, list[str]], group: str,
                      ranks: Iterable[int], seq: int) -> list[Finding]:
    """Findings for one verified call whose fingerprints differ across the group."""
    label = group_label(group, ranks)
    data = {"group": group, "seq": seq, "calls": {str(r): c.to_dict() for r, c in sorted(calls.items())}}
    detail = _calls_detail(calls)
    ops = {r: c.op for r, c in calls.items()}
    if len(set(ops.values())) > 1:
        left = _left_loop(calls, recent)
        if left:
            stay = sorted(set(calls) - set(left))
            title = (f"{_ranks(left)} left the loop at {calls[stay[0]].site} and called {calls[left[0]].op} "
                     f"while {_ranks(stay).lower()} still call {calls[stay[0]].op} (call #{seq} in {label})")
            return [UNEVEN(title, detail=detail, ranks=left, data=data, check=CHECK)]
        odd = _odd_ranks(ops)
        title = f"Call #{seq} in {label} differs: " + "; ".join(f"rank {r} called {ops[r]}" for r in sorted(ops))
        return [ORDER(title, detail=detail, ranks=odd, data=data, check=CHECK)]
    findings = []
    op = next(iter(ops.values()))
    for field, (kind, words) in _FIELD_KINDS.items():
        values = {r: getattr(c, field) for r, c in calls.items()}
        if len({repr(v) for v in values.values()}) < 2:
            continue
        odd = _odd_ranks(values)
        shown = "; ".join(f"rank {r}: {_field_text(field, calls[r])} at {calls[r].site}" for r in sorted(calls))
        title = f"{op} #{seq} in {label} with different {words}: {shown}"
        findings.append(kind(title, detail=detail, ranks=odd, data=data, check=CHECK))
    return findings


def _ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return ("Rank " if len(ranks) == 1 else "Ranks ") + ", ".join(map(str, ranks))


def work_finding(kind: Any, record: CallRecord, rank: int, state: str) -> Finding:
    title = f"{record.label()} at {record.site} in {record.function}: {state}"
    return kind(title, ranks=[rank], data={"call": record.to_dict()}, check=CHECK)

