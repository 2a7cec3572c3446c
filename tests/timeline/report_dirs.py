"""Report directories as the guard lays them out (docs/guard.md), written from values: any size, any damage."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

T0 = 1_795_000_000.0  # epoch seconds of the first event


def entry(seq: int, created_s: float, op: str = "all_reduce", thread: str = "1", **extra: Any) -> dict[str, Any]:
    """One flight-recorder entry with torch's keys (gloo's: no completion time, state scheduled)."""
    return {"record_id": seq, "pg_id": 0, "process_group": ("0", "default_pg"), "thread_id": thread,
            "thread_name": "python", "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": f"gloo:{op}", "time_created_ns": int(created_s * 1e9), "input_sizes": [[4680]],
            "input_dtypes": ["Float"], "output_sizes": [[4680]], "output_dtypes": ["Float"], "state": "scheduled",
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": True,
            "timeout_ms": 1800000, "is_p2p": False, **extra}


def dump(entries: list[dict[str, Any]], last_completed: int) -> dict[str, Any]:
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": {"0": {"last_enqueued_collective": entries[-1]["collective_seq_id"] if entries else -1,
                                "last_started_collective": -1, "last_completed_collective": last_completed}},
            "entries": entries}


def stall(episode: int, late: int | list[int], waiting: list[int], start_s: float, seconds: float | None,
          where: str = "train.py:14", title: str | None = None) -> dict[str, Any]:
    return {"episode": episode, "late_rank": late, "waiting_ranks": waiting, "where": where, "op": "all_reduce",
            "seq": 40 + episode, "group": "0", "started_s": start_s, "started_at": T0 + start_s, "seconds": seconds,
            "verdict": "job.E002", "cause": "straggler_rank",
            "title": title or f"Rank {late} has not arrived at all_reduce #{40 + episode}: at {where}",
            "action": "watch", "reports": 1, "reported_by": 0}


def snapshot(rank: int, host: str = "node-a", status: str = "running", where: str = "train.py:21",
             error: dict[str, Any] | None = None, time_s: float = 30.0) -> dict[str, Any]:
    file, _, line = where.partition(":")
    return {"rank": rank, "host": host, "pid": 1000 + rank, "status": status, "exit_code": None, "groups": [],
            "stack": [], "where": {"file": file, "line": int(line or 0), "function": "<module>", "code": ""},
            "in_collective": None, "error": error, "time": T0 + time_s, "collectives": 10, "source": "guard",
            "notes": [], "thread_errors": []}


def write_dir(root: Path, *, ranks: int, stalls: list[dict[str, Any]], hosts: dict[int, str] | None = None,
              dumps: dict[int, dict[str, Any]] | None = None, snapshots: dict[int, dict[str, Any]] | None = None,
              pickled: bool = True) -> Path:
    """A report directory: stalls.json, snapshots/rank<R>.json, flight_recorder/distdoctor_fr_rank_<R>."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "stalls.json").write_text(json.dumps(stalls, indent=1))
    (root / "snapshots").mkdir(exist_ok=True)
    for rank in range(ranks):
        snap = (snapshots or {}).get(rank) or snapshot(rank, host=(hosts or {}).get(rank, "node-a"))
        (root / "snapshots" / f"rank{rank}.json").write_text(json.dumps(snap))
    if dumps:
        (root / "flight_recorder").mkdir(exist_ok=True)
        for rank, content in dumps.items():
            path = root / "flight_recorder" / f"distdoctor_fr_rank_{rank}"
            path.write_bytes(pickle.dumps(content) if pickled else json.dumps(content).encode())
    return root


def steady_dumps(ranks: int, calls: int, every_s: float = 0.1, gap: tuple[int, float] | None = None) -> dict[int, dict]:
    """Every rank's recorder: `calls` all_reduces every `every_s`; gap=(seq, seconds) delays that one."""
    out = {}
    for rank in range(ranks):
        t, items = 0.0, []
        for seq in range(1, calls + 1):
            items.append(entry(seq, T0 + t))
            t += every_s + (gap[1] if gap and seq == gap[0] else 0.0)
        out[rank] = dump(items, calls)
    return out


def write_end_collectives(root: Path, rank: int, content: dict[str, Any], host: str = "node-a") -> None:
    """timeline/rank<R>.json as a rank leaves it at the end of a run with a stall (embedded.guard.evidence)."""
    folder = root / "timeline"
    folder.mkdir(parents=True, exist_ok=True)
    entries = [{**e, "process_group": list(e["process_group"])} for e in content["entries"]]
    (folder / f"rank{rank}.json").write_text(json.dumps({
        "schema": "distdoctor.collectives/1", "rank": rank, "host": host, "pid": 1000 + rank,
        "written_at": T0 + 3600, "flight_recorder": {**content, "entries": entries}}))
