"""The guard's finding kinds, and the diagnosis of a mismatch or a hang from every rank's calls."""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping

from distdoctor.embedded.guard.record import COLLECTIVES, POINT_TO_POINT, CallRecord
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
STRAGGLER = finding_kind("guard.E006", cause="straggler_rank", title="A rank has not arrived at the collective the others wait in",
                         hint="Look at what the late rank is doing at the named line (I/O, rank-0-only work, a slow data loader); move rank-only work out of the way or raise the hang timeout")
MISSING = finding_kind("guard.E007", cause="rank_missing", title="A rank stopped answering while the others wait in a collective",
                       hint="The rank died or is frozen (out of memory, a signal, a C extension holding the GIL); see its own log and the launcher's exit codes")
STUCK = finding_kind("guard.E008", cause="collective_timeout_hang", title="A collective did not complete within the hang timeout",
                     hint="Every rank that answered is in this call: suspect the transport (network, NCCL_/GLOO_SOCKET_IFNAME); run distdoctor check on these hosts")
DROPPED = finding_kind("guard.E009", cause="collective_timeout_hang", title="A point-to-point Work was dropped without wait()",
                       hint="Keep the Work that isend/irecv/batch_isend_irecv return and call .wait() on it before using the tensor or exiting")
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


# -- hangs -----------------------------------------------------------------------------------------


def _running_in(state: Mapping[str, Any], group: str) -> CallRecord | None:
    calls = [CallRecord.from_dict(c) for c in state.get("running", ()) if c.get("group") == group
             and c.get("op") in COLLECTIVES]
    return calls[-1] if calls else None


def _where(state: Mapping[str, Any]) -> str:
    where = state.get("where") or (state.get("stack") or ["?"])[-1]
    return str(where)


def _last_call(state: Mapping[str, Any], group: str) -> str:
    last = (state.get("last") or {}).get(group)
    return f"its last call there: {CallRecord.from_dict(last).summary()}" if last else "no call there yet"


def hang_findings(stuck: CallRecord, ranks: Iterable[int], states: Mapping[int, Mapping[str, Any] | None],
                  finals: Mapping[int, Mapping[str, Any]], waited_s: float, answer_s: float) -> list[Finding]:
    """Name why ``stuck`` (this rank's oldest running call) does not complete, from every rank's state."""
    if stuck.op in POINT_TO_POINT:
        return _p2p_hang(stuck, states, finals, waited_s, answer_s)
    group, label = stuck.group, group_label(stuck.group, ranks)
    arrived: dict[int, CallRecord] = {}
    other: dict[int, CallRecord] = {}
    late, finished, missing = [], [], []
    for rank in sorted(ranks):
        state = states.get(rank)
        if state is None:
            (finished if rank in finals else missing).append(rank)
            continue
        call = _running_in(state, group)
        if call is None:
            finished.append(rank) if state.get("phase") in ("finished", "destroyed") else late.append(rank)
        elif call.seq == stuck.seq and call.op == stuck.op:
            arrived[rank] = call
        else:
            other[rank] = call
    waiting = f"{_ranks(arrived).lower()} wait{'s' if len(arrived) == 1 else ''} in {stuck.summary()} since {waited_s:.1f} s"
    data = {"group": group, "seq": stuck.seq, "op": stuck.op, "waited_s": round(waited_s, 2),
            "states": {str(r): (dict(s) if s is not None else None) for r, s in sorted(states.items())},
            "finals": {str(r): dict(s) for r, s in sorted(finals.items())}}
    findings = []
    if other:
        findings += _hang_mismatch(stuck, arrived, other, states, label, data)
    for rank in late:
        state = states[rank]
        cause = _dropped_cause(rank, state, states)
        if cause is not None:
            findings.append(cause)
            continue
        title = (f"Rank {rank} has not arrived at {stuck.label()} in {label}: it is at {_where(state)} "
                 f"({_last_call(state, group)}); {waiting}")
        findings.append(STRAGGLER(title, detail=_stack_detail(rank, state), ranks=[rank], data=data, check=CHECK))
    for rank in finished:
        state = states.get(rank) or finals.get(rank) or {}
        done = (state.get("completed") or {}).get(group, -1)
        title = (f"Rank {rank} finished ({state.get('phase', 'finished')}) after call #{done} in {label}, "
                 f"while {waiting}")
        findings.append(UNEVEN(title, detail=_stack_detail(rank, state), ranks=[rank], data=data, check=CHECK))
    if missing:
        title = (f"{_ranks(missing)} did not answer within {answer_s:.1f} s (died or frozen) while {waiting}")
        findings.append(MISSING(title, detail=_calls_detail(arrived), ranks=missing, data=data, check=CHECK))
    if not findings:
        title = f"Every rank is in {stuck.label()} in {label} and it has not completed for {waited_s:.1f} s"
        findings.append(STUCK(title, detail=_calls_detail(arrived), ranks=sorted(arrived), data=data, check=CHECK))
    return findings


def _p2p_hang(stuck: CallRecord, states: Mapping[int, Any], finals: Mapping[int, Any], waited_s: float,
              answer_s: float) -> list[Finding]:
    """A send or receive that does not complete: what is its peer doing?"""
    me = next((r for r, s in states.items() if s is not None and any(
        c.get("op") == stuck.op and c.get("seq") == stuck.seq for c in s.get("running", ()))), None)
    peer = stuck.params.get("peer")
    data = {"call": stuck.to_dict(), "waited_s": round(waited_s, 2),
            "states": {str(r): (dict(s) if s is not None else None) for r, s in sorted(states.items())}}
    if me is not None:
        dropped = _dropped_cause(me, states[me], states)
        if dropped is not None:
            return [dropped]
    waiting = f"rank {me} waits in {stuck.summary()} since {waited_s:.1f} s"
    if not isinstance(peer, int):
        return [STUCK(f"{waiting[0].upper()}{waiting[1:]} (from any rank)", ranks=[me] if me is not None else [],
                      data=data, check=CHECK)]
    state = states.get(peer)
    if state is None and peer in finals:
        return [UNEVEN(f"Rank {peer} finished while {waiting}", ranks=[peer], data=data, check=CHECK)]
    if state is None:
        return [MISSING(f"Rank {peer} did not answer within {answer_s:.1f} s (died or frozen) while {waiting}",
                        ranks=[peer], data=data, check=CHECK)]
    matching = [c for c in state.get("running", ()) if c.get("params", {}).get("peer") == me]
    if matching:
        title = f"Rank {peer} is in {CallRecord.from_dict(matching[-1]).summary()} and {waiting}: neither completes"
        return [STUCK(title, ranks=sorted({peer, me}), data=data, check=CHECK)]
    title = f"Rank {peer} has not reached the matching call: it is at {_where(state)}, while {waiting}"
    return [STRAGGLER(title, detail=_stack_detail(peer, state), ranks=[peer], data=data, check=CHECK)]


def _dropped_cause(rank: int, state: Mapping[str, Any], states: Mapping[int, Any]) -> Finding | None:
    """A rank blocked in a receive from a peer that dropped its matching send without wait()."""
    for raw in state.get("running", ()):
        if raw.get("op") not in ("recv", "irecv", "recv_object_list"):
            continue
        call = CallRecord.from_dict(raw)
        peer = states.get(call.params.get("peer")) if isinstance(call.params.get("peer"), int) else None
        for dropped in (peer or {}).get("dropped", ()):
            sent = CallRecord.from_dict(dropped)
            if sent.params.get("peer") == rank:
                title = (f"Rank {call.params['peer']} dropped {sent.label()} at {sent.site} without wait(); "
                         f"rank {rank} waits in {call.summary()} for it")
                return DROPPED(title, detail=_stack_detail(rank, state), ranks=[call.params["peer"]],
                               data={"send": sent.to_dict(), "receive": call.to_dict()}, check=CHECK)
    return None


def finished_findings(call: CallRecord, ranks: Iterable[int], finals: Mapping[int, Mapping[str, Any]], rank: int,
                      failure: str) -> list[Finding]:
    """Ranks that finished (their final state) while ``rank``'s ``call`` failed in torch."""
    label = group_label(call.group, ranks)
    findings = []
    for peer, state in sorted(finals.items()):
        done = (state.get("completed") or {}).get(call.group, -1)
        title = (f"Rank {peer} finished ({state.get('phase', 'finished')}) after call #{done} in {label}, "
                 f"so rank {rank}'s {call.summary()} failed: {failure}")
        findings.append(UNEVEN(title, detail=_stack_detail(peer, state), ranks=[peer],
                               data={"call": call.to_dict(), "final": dict(state)}, check=CHECK))
    return findings


def _hang_mismatch(stuck: CallRecord, arrived: Mapping[int, CallRecord], other: Mapping[int, CallRecord],
                   states: Mapping[int, Any], label: str, data: dict) -> list[Finding]:
    calls = {**arrived, **other}
    recent = {r: list((states.get(r) or {}).get("recent", {}).get(stuck.group, ())) for r in calls}
    # The running call is the last recorded one; the loop test looks at the calls before it.
    recent = {r: sites[:-1] if sites and sites[-1] == calls[r].site else sites for r, sites in recent.items()}
    left = _left_loop(calls, recent)
    detail = _calls_detail(calls)
    if left:
        title = (f"{_ranks(left)} left the loop at {stuck.site} and {'is' if len(left) == 1 else 'are'} in "
                 f"{calls[left[0]].summary()}, while {_ranks(arrived).lower()} wait in {stuck.summary()}")
        return [UNEVEN(title, detail=detail, ranks=left, data=data, check=CHECK)]
    title = (f"Ranks wait in different collectives of {label}: "
             + "; ".join(f"rank {r} in {calls[r].summary()}" for r in sorted(calls)))
    return [ORDER(title, detail=detail, ranks=sorted(other), data=data, check=CHECK)]


def _stack_detail(rank: int, state: Mapping[str, Any]) -> str:
    stack = list(state.get("stack") or ())
    return f"rank {rank}'s stack (innermost last):\n  " + "\n  ".join(stack[-12:]) if stack else ""


def work_finding(kind: Any, record: CallRecord, rank: int, state: str) -> Finding:
    title = f"{record.label()} at {record.site} in {record.function}: {state}"
    return kind(title, ranks=[rank], data={"call": record.to_dict()}, check=CHECK)

