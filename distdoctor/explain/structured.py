"""Inputs that are data, not text: TORCHELASTIC error files, flight-recorder dumps, distdoctor's reports' snapshots."""

# - A TORCHELASTIC error file (torchrun --log-dir's attempt_N/<rank>/error.json, or the file
#   TORCHELASTIC_ERROR_FILE names; torch.distributed.elastic.multiprocessing.errors writes it from
#   @record): {"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack": "<traceback>",
#   "timestamp": "<epoch>"}}}, or {"message": "<text>"} (newer/other writers). Its traceback is parsed
#   like a log's; its rank is its directory's (attempt_0/1/error.json) or the one in its name.
# - torch's flight-recorder dump, one per rank: the pickle that _dump_fr_trace returns and
#   TORCH_FR_DUMP_TEMP_FILE<rank> holds (plain dicts and lists: it is read with an unpickler that
#   refuses every class, so a hostile pickle cannot run code), or the JSON of _dump_fr_trace_json.
#   Its rank is the trailing number of its name (torch's own reader does the same).
# - distdoctor's reports whose findings carry `snapshots` (the guard's hang reports, `stacks`), and
#   bare snapshots (the guard's --report-dir snapshots/rank<R>.json): read back with
#   RankSnapshot.from_dict, which never trusts its input.
# A file that looks like one of these and is broken (truncated, corrupt) is skipped and named.

from __future__ import annotations

import re
from typing import Any

from distdoctor.diagnosis.flight_recorder import is_pickle, load_pickled, read_dump
from distdoctor.diagnosis.snapshot import RankSnapshot
from distdoctor.explain.own_reports import consume, read_json
from distdoctor.explain.ranks import parse_traceback_text
from distdoctor.explain.reader import LogInputError, LogSource, peek
from distdoctor.explain.snapshots import JobEvidence

MAX_DUMP_BYTES = 64 << 20
_TRAILING_NUMBER = re.compile(r"(\d{1,7})(?:\.(?:json|pkl|pickle))?$")
# distdoctor's own pictures in a --report-dir (docs/report.md): read as what they are, never as logs,
# whose text (findings' titles, a rank's line) would match the catalog a second time.
HTML_REPORT_HEAD = b"<!DOCTYPE html>\n<!-- distdoctor report"
TIMELINE_SCHEMA = "distdoctor.collectives/"


def dump_rank(source: LogSource) -> int | None:
    if source.rank_hint is not None:
        return source.rank_hint
    match = _TRAILING_NUMBER.search(source.path.name if source.path else source.name)
    return int(match.group(1)) if match else None


def read_structured(source: LogSource, evidence: JobEvidence) -> str | None:
    """What the input was when it is data (its content added to the evidence); None: read it as a log.

    Raises LogInputError (with the file named) for a dump that is broken.
    """
    head = peek(source, 512)
    if is_pickle(head):
        return _read_pickle(source, evidence)
    if head.startswith(HTML_REPORT_HEAD):
        consume(source)  # distdoctor's own HTML report: its findings are in the JSON reports beside it
        return "distdoctor HTML report (not read)"
    objects = read_json(source)
    if not objects:
        return None
    first = objects[0]
    if isinstance(first, dict) and ("traceEvents" in first or str(first.get("schema", "")).startswith(TIMELINE_SCHEMA)):
        consume(source)  # the job as a picture (trace.json) or its material: drawn from the evidence read here
        return "distdoctor timeline (not read)"
    if isinstance(first, dict) and ("entries" in first or "pg_status" in first):
        _add_dump(source, first, evidence)
        consume(source)
        return "flight-recorder dump (JSON)"
    snapshot = _bare_snapshot(first) if len(objects) == 1 else None
    if snapshot is not None:
        # The runtime guard's --report-dir writes each rank's RankSnapshot as snapshots/rank<R>.json.
        evidence.reported.append(snapshot)
        consume(source)
        return "rank snapshot"
    if isinstance(first, dict) and "message" in first and len(objects) == 1:
        if _add_error_file(source, first, evidence):
            consume(source)
            return "TORCHELASTIC error file"
    snaps = [s for obj in objects for s in _report_snapshots(obj)]
    if snaps:
        evidence.reported.extend(snaps)
    return None


def _read_pickle(source: LogSource, evidence: JobEvidence) -> str:
    data = source.prefix + (source.stream.read(MAX_DUMP_BYTES) if source.stream is not None else b"")
    source.prefix = b""
    source.bytes = len(data)
    if len(data) > MAX_DUMP_BYTES:
        raise LogInputError(f"{source.name}: a pickle larger than {MAX_DUMP_BYTES >> 20} MB, not read")
    try:
        dump = load_pickled(data)
    except Exception as exc:  # a truncated or hostile pickle: any unpickling error is "not readable"
        raise LogInputError(f"{source.name}: not a readable flight-recorder dump ({type(exc).__name__}: "
                            f"{str(exc)[:120]})") from None
    if not isinstance(dump, dict):
        raise LogInputError(f"{source.name}: a pickle that is not a flight-recorder dump")
    _add_dump(source, dump, evidence)
    return "flight-recorder dump (pickle)"


def _add_dump(source: LogSource, dump: dict, evidence: JobEvidence) -> None:
    rank = dump_rank(source)
    if rank is None:
        raise LogInputError(f"{source.name}: a flight-recorder dump whose rank its name does not say "
                            "(torch names them <prefix><rank>, e.g. nccl_trace_rank_3)")
    groups = read_dump(dump)
    if groups is None:
        raise LogInputError(f"{source.name}: not a flight-recorder dump (no pg_status / entries)")
    evidence.groups[rank] = groups
    evidence.collector.rank(rank)


def _add_error_file(source: LogSource, data: dict, evidence: JobEvidence) -> bool:
    message = data.get("message")
    if isinstance(message, dict):
        text = str(message.get("message") or "")
        extra = message.get("extraInfo") if isinstance(message.get("extraInfo"), dict) else {}
        callstack = str(extra.get("py_callstack") or "")
    elif isinstance(message, str):
        text, callstack = message, ""
    else:
        return False
    rank = source.rank_hint
    if rank is None:
        return False
    raised = parse_traceback_text(callstack[:200_000], source.name, rank) if callstack else None
    if raised is None and ":" in text:
        name, _, rest = text.partition(":")
        raised = parse_traceback_text(f"Traceback (most recent call last):\n{name}:{rest.splitlines()[0] if rest else ''}\n",
                                      source.name, rank)
    text_entry = evidence.collector.rank(rank)
    if raised is None or text_entry is None:
        return False
    if raised.time is None:
        stamp = (message.get("extraInfo") or {}).get("timestamp") if isinstance(message, dict) else data.get("timestamp")
        raised.time = _iso(stamp)
    text_entry.error_file = raised
    text_entry.files.add(source.name)
    return True


def _iso(stamp: Any) -> str | None:
    from datetime import datetime  # only for error files, which are few
    try:
        return datetime.fromtimestamp(int(stamp)).isoformat(sep=" ")
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def _bare_snapshot(obj: Any) -> RankSnapshot | None:
    """A RankSnapshot's JSON (to_dict) on its own: a rank, a status, and no report or dump keys."""
    if not isinstance(obj, dict) or "schema" in obj or "status" not in obj or "rank" not in obj:
        return None
    if not ({"groups", "stack", "error", "source"} & set(obj)):
        return None
    return RankSnapshot.from_dict(obj)


def _report_snapshots(obj: Any) -> list[RankSnapshot]:
    if not isinstance(obj, dict) or not isinstance(obj.get("findings"), list):
        return []
    out = []
    for finding in obj["findings"][:500]:
        data = finding.get("data") if isinstance(finding, dict) else None
        raw = data.get("snapshots") if isinstance(data, dict) else None
        for item in raw[:4096] if isinstance(raw, list) else []:
            snap = RankSnapshot.from_dict(item)
            if snap is not None:
                out.append(snap)
    return out
