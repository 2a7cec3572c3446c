"""What a picture of the job is drawn from: a guard's --report-dir or flight-recorder dumps, read without trust."""

# Inputs: the guard's report directory (stalls.json, snapshots/rank<R>.json, flight_recorder/<prefix><R>,
# timeline/rank<R>.json — the end-of-run collectives —, slow_ranks.json — the job's pace, read by
# timeline.pace —, distdoctor-guard-*.json reports), or a folder
# of torch's own dumps (TORCH_FR_DUMP_TEMP_FILE's <prefix><rank>, pickle or JSON). Several inputs
# (one report directory per host) are merged. Every file is bounded in size, every value checked: a
# half-written file (a job killed mid-write), an older layout or a foreign file is named in `lacks`
# and the rest is drawn; nothing here raises on bad input.

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from distdoctor.core.findings import Finding
from distdoctor.core.redact import redact_text
from distdoctor.core.report import format_ranks
from distdoctor.diagnosis.flight_recorder import is_pickle, load_pickled
from distdoctor.timeline.pace import PACE_SCHEMA, take_pace

MAX_FILES = 20_000               # 4,096 ranks leave a snapshot, a dump and a timeline file each
MAX_DUMP_BYTES = 64 << 20
MAX_JSON_BYTES = 128 << 20       # stalls.json at 4,096 ranks: 200 episodes of 4,095 waiting ranks, indented
MAX_ENTRIES = 20_000             # per dump: far above any recorder ring the guard sets (2,000)
MAX_STALLS = 10_000              # stalls.json keeps 200 whole; a foreign one is read this far
MAX_FINDINGS = 500
COLLECTIVES_SCHEMA = "distdoctor.collectives/1"
TIMELINE_DIR = "timeline"
FR_DIR = "flight_recorder"
DRAWN = ("trace.json", "report.html")
_TRAILING_NUMBER = re.compile(r"(\d{1,7})(?:\.(?:json|pkl|pickle))?$")
_STATUS_FAULTS = {"raised": "raise", "exited": "exit", "killed": "kill"}


@dataclass
class RankFacts:
    """One rank as the evidence knows it."""

    rank: int
    host: str = ""
    pid: int | None = None
    status: str = ""
    where: str = ""
    time: float | None = None


@dataclass
class Fault:
    """A rank that raised, exited or was killed, and when (epoch seconds)."""

    rank: int
    kind: str                    # raise / exit / kill
    time: float
    text: str


@dataclass
class Material:
    """Everything read, merged over the inputs."""

    ranks: dict[int, RankFacts] = field(default_factory=dict)
    stalls: list[dict[str, Any]] = field(default_factory=list)
    omitted: dict[str, Any] | None = None         # stalls.json's summary of the episodes past its first 200
    entries: dict[int, list[dict[str, Any]]] = field(default_factory=dict)   # rank -> recorder entries
    completed: dict[int, dict[str, int]] = field(default_factory=dict)       # rank -> group -> last completed
    dumped_at: dict[int, float] = field(default_factory=dict)                # rank -> epoch s of its latest dump
    group_names: dict[str, str] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    world_size: int | None = None
    lacks: list[str] = field(default_factory=list)
    files: int = 0
    pace: dict[str, Any] | None = None            # slow_ranks.json, checked (timeline.pace)

    def rank(self, rank: int) -> RankFacts:
        facts = self.ranks.get(rank)
        if facts is None:
            facts = self.ranks[rank] = RankFacts(rank)
        return facts

    def lack(self, text: str) -> None:
        if text not in self.lacks and len(self.lacks) < 50:
            self.lacks.append(text)


class InputError(Exception):
    """An input that cannot be read at all (missing, not a directory or file of evidence)."""


def read_material(inputs: list[str | Path]) -> Material:
    """The evidence in these inputs; raises InputError only when an input does not exist."""
    material = Material()
    for raw in inputs:
        path = Path(raw)
        if not path.exists():
            raise InputError(f"{raw}: no such file or directory")
        files = list(_walk(path)) if path.is_dir() else [path]
        for file in _without_superseded(files):
            if material.files >= MAX_FILES:
                material.lack(f"more than {MAX_FILES} files: the rest were not read")
                break
            material.files += 1
            _read_file(file, material)
    _finish(material)
    return material


def _without_superseded(files: list[Path]) -> list[Path]:
    """A rank's end-of-run collectives (timeline/rank<R>.json) hold its recorder's newest entries, and the
    trace draws the newest: its stall-time dump (flight_recorder/<prefix><R>) is then not read. At 4,096
    ranks that is gigabytes of pickles rank 0 does not unpickle at its exit."""
    ended = {f.stem[4:] for f in files if f.parent.name == TIMELINE_DIR and re.fullmatch(r"rank\d+", f.stem)}
    if not ended:
        return files
    out = []
    for file in files:
        match = _TRAILING_NUMBER.search(file.name)
        if file.parent.name == FR_DIR and match and match.group(1) in ended:
            continue
        out.append(file)
    return out


def _walk(root: Path) -> Iterator[Path]:
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if name.startswith(".") or name in DRAWN:
                continue  # the guard's temporary files (.name.PID.tmp), and the pictures drawn from the rest
            full = Path(folder) / name
            try:
                if stat.S_ISREG(full.stat().st_mode):
                    yield full
            except OSError:
                continue


def _read_file(path: Path, material: Material) -> None:
    name = path.name
    try:
        info = path.stat()
        size = info.st_size
        with open(path, "rb") as handle:
            head = handle.read(2)
            if is_pickle(head):
                if size > MAX_DUMP_BYTES:
                    material.lack(f"{name}: a dump over {MAX_DUMP_BYTES >> 20} MB, not read")
                    return
                data = head + handle.read(MAX_DUMP_BYTES)
            elif head[:1] in (b"{", b"["):
                if size > MAX_JSON_BYTES:
                    material.lack(f"{name}: over {MAX_JSON_BYTES >> 20} MB, not read")
                    return
                data = head + handle.read(MAX_JSON_BYTES)
            else:
                return  # logs, the HTML report: not evidence for the picture
    except OSError as exc:
        material.lack(f"{name}: cannot read ({exc.strerror or exc})")
        return
    if is_pickle(data):
        try:
            obj = load_pickled(data)
        except Exception as exc:  # truncated or hostile: any unpickling error is "not readable"
            material.lack(f"{name}: not a readable flight-recorder dump ({type(exc).__name__}; a job killed mid-write?)")
            return
    else:
        try:
            obj = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError):
            material.lack(f"{name}: not complete JSON (a job killed while writing it?)")
            return
    _take(path, obj, material, info.st_mtime)


def _take(path: Path, obj: Any, material: Material, mtime: float) -> None:
    name = path.name
    if name == "stalls.json" or (isinstance(obj, list) and obj and isinstance(obj[0], Mapping) and "episode" in obj[0]):
        _take_stalls(obj, material)
    elif isinstance(obj, Mapping) and obj.get("schema") == PACE_SCHEMA:
        take_pace(obj, material)
    elif isinstance(obj, Mapping) and obj.get("schema") == COLLECTIVES_SCHEMA:
        _take_dump(_int(obj.get("rank")), obj.get("flight_recorder"), material, name, obj)
    elif isinstance(obj, Mapping) and ("entries" in obj or "pg_status" in obj):
        match = _TRAILING_NUMBER.search(name)
        _take_dump(int(match.group(1)) if match else None, obj, material, name, {"written_at": mtime})
    elif isinstance(obj, Mapping) and str(obj.get("schema", "")).startswith("distdoctor.report/"):
        _take_report(obj, material)
    elif isinstance(obj, Mapping) and "rank" in obj and "status" in obj and not obj.get("schema"):
        _take_snapshot(obj, material)


def _take_stalls(obj: Any, material: Material) -> None:
    if not isinstance(obj, list):
        material.lack("stalls.json: not a list of episodes (another version?)")
        return
    for item in obj[:MAX_STALLS]:
        if not isinstance(item, Mapping):
            continue
        if "omitted" in item and "episode" not in item:
            material.omitted = dict(item)
            continue
        stall = _stall(item)
        if stall is None:
            material.lack("stalls.json: an episode without its start or its ranks was left out")
            continue
        if not any(s["episode"] == stall["episode"] for s in material.stalls):
            material.stalls.append(stall)
    if len(obj) > MAX_STALLS:
        material.lack(f"stalls.json: {len(obj)} episodes; the first {MAX_STALLS} drawn")


def _stall(item: Mapping[str, Any]) -> dict[str, Any] | None:
    late_raw = item.get("late_rank")
    late = [late_raw] if isinstance(late_raw, int) else [r for r in late_raw or () if isinstance(r, int)] \
        if isinstance(late_raw, list) else []
    waiting = [r for r in item.get("waiting_ranks") or () if isinstance(r, int)] \
        if isinstance(item.get("waiting_ranks"), list) else []
    start = _float(item.get("started_at"))
    if start is None or not (late or waiting):
        return None
    seconds = _float(item.get("seconds"))
    return {"episode": _int(item.get("episode")) or 0, "late": late[:4096], "waiting": waiting[:100_000],
            "start": start, "seconds": seconds if seconds is None or seconds >= 0 else None,
            "where": _text(item.get("where"), 300), "call": _text(item.get("call"), 300),
            "op": _text(item.get("op"), 60), "seq": _int(item.get("seq")),
            "group": _text(item.get("group"), 100), "verdict": _text(item.get("verdict"), 40),
            "cause": _text(item.get("cause"), 60), "title": _text(item.get("title"), 600),
            "action": _text(item.get("action"), 20)}


def _take_dump(rank: int | None, dump: Any, material: Material, name: str, wrapper: Mapping[str, Any]) -> None:
    if rank is None or not isinstance(dump, Mapping):
        material.lack(f"{name}: a flight-recorder dump whose rank its name does not say")
        return
    facts = material.rank(rank)
    if wrapper.get("host") and not facts.host:
        facts.host = _text(wrapper.get("host"), 200)
    at = _float(wrapper.get("written_at"))
    if at is not None:
        material.dumped_at[rank] = max(at, material.dumped_at.get(rank, 0.0))
    entries = dump.get("entries")
    kept = material.entries.setdefault(rank, [])
    seen = {_key(e) for e in kept}
    for entry in entries[:MAX_ENTRIES] if isinstance(entries, list) else ():
        if isinstance(entry, Mapping) and _key(entry) not in seen:
            seen.add(_key(entry))
            kept.append(dict(entry))
    status = dump.get("pg_status")
    for group, state in status.items() if isinstance(status, Mapping) else ():
        done = _int(state.get("last_completed_collective")) if isinstance(state, Mapping) else None
        if done is not None:
            groups = material.completed.setdefault(rank, {})
            groups[str(group)] = max(done, groups.get(str(group), -1))
    config = dump.get("pg_config")
    for key, value in config.items() if isinstance(config, Mapping) else ():
        if isinstance(value, Mapping) and value.get("desc"):
            material.group_names.setdefault(str(key) or "0", _text(value.get("desc"), 100))


def _key(entry: Mapping[str, Any]) -> tuple:
    group = entry.get("process_group")
    return (str(group[0]) if isinstance(group, (list, tuple)) and group else str(entry.get("pg_id")),
            entry.get("collective_seq_id"), entry.get("p2p_seq_id"), entry.get("op_id"), entry.get("time_created_ns"))


def _take_snapshot(obj: Mapping[str, Any], material: Material) -> None:
    rank = _int(obj.get("rank"))
    if rank is None or rank < 0:
        return
    facts = material.rank(rank)
    facts.host = facts.host or _text(obj.get("host"), 200)
    facts.pid = facts.pid or _int(obj.get("pid"))
    facts.status = _text(obj.get("status"), 20)
    facts.time = _float(obj.get("time"))
    where = obj.get("where")
    if isinstance(where, Mapping) and where.get("file"):
        facts.where = f"{_text(where.get('file'), 200)}:{_int(where.get('line'))}"
    kind = _STATUS_FAULTS.get(facts.status)
    error = obj.get("error") if isinstance(obj.get("error"), Mapping) else {}
    when = _float(error.get("time")) or facts.time
    if kind and when is not None:
        text = (f"{_text(error.get('type'), 100)}: {_text(error.get('message'), 300)}" if error.get("type")
                else f"{facts.status} (exit code {obj.get('exit_code')})")
        if not any(f.rank == rank and f.kind == kind for f in material.faults):
            material.faults.append(Fault(rank, kind, when, text))


def _take_report(obj: Mapping[str, Any], material: Material) -> None:
    world = obj.get("world") if isinstance(obj.get("world"), Mapping) else {}
    size = _int(world.get("size"))
    if size and size > 0:
        material.world_size = max(size, material.world_size or 0)
    for raw in (obj.get("findings") or [])[:MAX_FINDINGS] if isinstance(obj.get("findings"), list) else ():
        try:
            finding = Finding.from_dict(raw)
        except (KeyError, ValueError, TypeError, AttributeError):
            continue
        for snap in (finding.data or {}).get("snapshots") or ():
            if isinstance(snap, Mapping):
                _take_snapshot(snap, material)
        if not any(f.id == finding.id and f.title == finding.title for f in material.findings):
            # Every rank's snapshot is drawn from above; the finding keeps the rest of its data.
            data = {k: v for k, v in (finding.data or {}).items() if k != "snapshots"}
            material.findings.append(dataclasses.replace(finding, data=data))


def _finish(material: Material) -> None:
    for stall in material.stalls:  # lines of code and exception messages: secrets out, as in every report
        stall["title"], stall["where"] = redact_text(stall["title"]), redact_text(stall["where"])
        stall["call"] = redact_text(stall["call"])
    for fault in material.faults:
        fault.text = redact_text(fault.text)
    if not material.stalls and material.omitted is None and material.pace is None:
        material.lack("no stalls.json: no stall past the hang timeout was recorded (or the guard ran without --report-dir)")
    if not material.entries:
        if material.stalls or material.pace is None:  # a run drawn for its pace alone had no stall to dump
            material.lack("no flight-recorder dump: collectives are not drawn (the recorder was off, or no rank dumped)")
    else:
        without = sorted(r for r in material.ranks if r not in material.entries)
        if without:
            material.lack(f"no flight-recorder dump of rank{'s' if len(without) > 1 else ''} {format_ranks(without)}: "
                          "their collectives are not drawn")
    for stall in material.stalls:
        for rank in stall["late"] + stall["waiting"]:
            material.rank(rank)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 20:
        return int(value)
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if number == number and abs(number) < 1e13 else None


def _text(value: Any, limit: int) -> str:
    return "" if value is None else str(value)[:limit]
