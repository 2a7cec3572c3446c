"""torch's flight-recorder dump (the JSON or the pickled form) -> per process group progress."""

# torch (c10d's FlightRecorder) returns one dump per process: `version`, `pg_config` (group id ->
# name, desc, ranks as text "[0, 1]"), `pg_status` (group id -> last_enqueued_collective,
# last_started_collective, last_completed_collective, as text or int; -1 when none) and `entries`
# (one per recorded collective: collective_seq_id, p2p_seq_id, is_p2p, profiling_name such as
# "gloo:all_reduce" or "nccl:all_reduce", input_sizes, input_dtypes, state scheduled / started /
# completed, process_group [id, desc], time_created_ns, ...). The same keys come from
# `_dump_fr_trace_json` and from the pickle that `_dump_fr_trace` / TORCH_FR_DUMP_TEMP_FILE
# write. Everything read is bounded and validated: a truncated or foreign dump gives
# `None` / fewer groups, never an exception.

from __future__ import annotations

import ast
import io
import pickle
import time
from typing import Any, Mapping

from distdoctor.diagnosis.snapshot import GroupProgress, PendingOp

RECENT = 16          # entries kept per group for comparing ranks at one sequence number
_MAX_ENTRIES = 20000  # a dump larger than any sane buffer is read only this far


PICKLE_PROTOCOLS = (2, 3, 4, 5)


class _NoClasses(pickle.Unpickler):
    """Plain containers only: a flight-recorder dump has no class in it; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused class {module[:60]}.{name[:60]}")


def is_pickle(head: bytes) -> bool:
    """Whether these first bytes start a pickle (what torch's _dump_fr_trace writes)."""
    return len(head) >= 2 and head[0] == 0x80 and head[1] in PICKLE_PROTOCOLS


def load_pickled(data: bytes) -> Any:
    """A pickled dump read without running anything: every class is refused, so a hostile file
    cannot run code. Raises pickle.UnpicklingError (or another error of a broken pickle)."""
    return _NoClasses(io.BytesIO(data)).load()


def _seq(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def _op_name(profiling_name: Any) -> str:
    """`gloo:all_reduce` / `nccl:all_reduce` -> `all_reduce`."""
    name = str(profiling_name or "?")
    return name.split(":", 1)[1] if ":" in name else name


def _sizes(raw: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(raw, (list, tuple)):
        return ()
    out = []
    for shape in list(raw)[:32]:
        if isinstance(shape, (list, tuple)):
            out.append(tuple(int(d) for d in shape[:16] if isinstance(d, int) or str(d).lstrip("-").isdigit()))
    return tuple(out)


def entry_op(entry: Mapping[str, Any], now_ns: int | None = None) -> PendingOp | None:
    """One recorder entry as a PendingOp (collectives only: point-to-point entries give None)."""
    if not isinstance(entry, Mapping) or entry.get("is_p2p"):
        return None
    seq = _seq(entry.get("collective_seq_id"))
    if seq is None:
        return None
    # The age is only meaningful for the pending entry: gloo leaves completed entries "scheduled".
    age = None
    created = entry.get("time_created_ns")
    if now_ns and isinstance(created, int) and created > 0:
        age = round(max(0, now_ns - created) / 1e9, 2)
    dtypes = entry.get("input_dtypes")
    return PendingOp(op=_op_name(entry.get("profiling_name")), seq=seq, sizes=_sizes(entry.get("input_sizes")),
                     dtypes=tuple(str(d)[:40] for d in dtypes[:32]) if isinstance(dtypes, (list, tuple)) else (),
                     state=str(entry.get("state") or "")[:40], age_s=age)


def _group_of(entry: Mapping[str, Any]) -> str | None:
    group = entry.get("process_group")
    if isinstance(group, (list, tuple)) and group:
        return str(group[0])[:100]
    pg_id = entry.get("pg_id")
    return str(pg_id) if pg_id is not None else None


def _ranks(config: Any) -> tuple[int, ...]:
    raw = config.get("ranks") if isinstance(config, Mapping) else None
    if isinstance(raw, str):
        try:
            raw = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            return ()
    if isinstance(raw, (list, tuple)):
        return tuple(int(r) for r in raw[:100000] if isinstance(r, int))
    return ()


def read_dump(dump: Any, now_ns: int | None = None) -> tuple[GroupProgress, ...] | None:
    """The groups of one rank's dump; None when it is not a flight-recorder dump at all."""
    if not isinstance(dump, Mapping) or not isinstance(dump.get("pg_status", {}), Mapping):
        return None
    if "entries" not in dump and "pg_status" not in dump:
        return None
    now_ns = now_ns if now_ns is not None else time.time_ns()
    entries = dump.get("entries")
    by_group: dict[str, list[PendingOp]] = {}
    numbers: dict[str, list[tuple[int, int]]] = {}  # group -> (op_id, collective_seq_id) of its collectives
    for entry in (entries[:_MAX_ENTRIES] if isinstance(entries, list) else []):
        op = entry_op(entry, now_ns) if isinstance(entry, Mapping) else None
        group = _group_of(entry) if op is not None else None
        if op is not None and group is not None:
            by_group.setdefault(group, []).append(op)
            op_id = _seq(entry.get("op_id"))
            if op_id is not None and op.seq is not None:
                numbers.setdefault(group, []).append((op_id, op.seq))
    if isinstance(entries, list) and len(entries) > _MAX_ENTRIES:
        numbers = {}  # the newest entries were not read: the counts cannot be translated by them
    configs = dump.get("pg_config") if isinstance(dump.get("pg_config"), Mapping) else {}
    status = dump.get("pg_status") or {}
    groups = []
    for group in sorted(set(map(str, status)) | set(by_group), key=lambda g: (len(g), g)):
        state = status.get(group) if isinstance(status.get(group), Mapping) else {}
        ops = sorted(by_group.get(group, []), key=lambda op: op.seq or 0)
        enqueued, completed = _collective_numbers(_seq(state.get("last_enqueued_collective")),
                                                  _seq(state.get("last_completed_collective")), numbers.get(group, []))
        if enqueued is None and ops:
            enqueued = ops[-1].seq
        pending = next((op for op in ops if op.state != "completed" and op.seq is not None
                        and (completed is None or op.seq > completed)), None)
        recent = tuple(_without_age(op) for op in ops[-RECENT:])
        groups.append(GroupProgress(group=group, ranks=_ranks(configs.get(group)), last_enqueued=enqueued,
                                    last_completed=completed, pending=pending, recent=recent))
    return tuple(groups)


def _collective_numbers(enqueued: int | None, completed: int | None,
                        numbers: list[tuple[int, int]]) -> tuple[int | None, int | None]:
    """The group's last enqueued and completed collective, numbered as its entries are.

    Gloo's pg_status counts every op (its op_id: point-to-point ones too) while the entries number
    collectives alone (collective_seq_id): on a rank that sent or received, the two drift apart, and
    a count compared with an entry's number, or with a peer's count, is off by the rank's own
    point-to-point calls (a rank outside any call read as pending in one; two ranks at one collective
    read as at two). Told apart by the newest entry: its op_id is the enqueued count (op numbering,
    translated here) or its collective number is (left as it is)."""
    if enqueued is None or not numbers:
        return enqueued, completed
    newest_op, newest_seq = max(numbers)
    if enqueued == newest_seq or newest_op == newest_seq or enqueued < newest_op:
        return enqueued, completed
    ordered = sorted(numbers)

    def translated(count: int | None) -> int | None:
        if count is None or count < ordered[0][0]:
            return count  # older than every entry kept: cannot be translated, left as torch said
        return max(seq for op_id, seq in ordered if op_id <= count)

    return translated(enqueued), translated(completed)


def _without_age(op: PendingOp) -> PendingOp:
    return PendingOp(op.op, op.seq, op.sizes, op.dtypes, op.state, None)
