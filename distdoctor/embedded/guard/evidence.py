"""What each rank leaves in the report directory on a hang or a failure, for `explain` and torch's analyzer."""

# Layout of --report-dir (DISTDOCTOR_REPORT_DIR), every file written by the rank it names:
#   distdoctor-guard-hang-rank<R>-<PID>.json        the deciding rank's report (distdoctor.report/1)
#   distdoctor-guard-exception-rank<R>-<PID>.json   a rank's report after an exception (its own or a peer's)
#   distdoctor-guard-mismatch-rank<R>-<PID>.json    a GuardError's report (the group's lowest rank)
#   distdoctor-guard-summary-rank<R>-<PID>.json     findings left at exit (p2p Works never waited on)
#   snapshots/rank<R>.json                          the rank's RankSnapshot (diagnosis.snapshot, to_dict)
#   flight_recorder/distdoctor_fr_rank_<R>          torch's flight-recorder dump, torch's pickle format
#   stalls.json                                     every stall of the run past hang_timeout (a list; written by the
#                                                   rank that owns an episode as it changes, and by rank 0 at the end)
#   timeline/rank<R>.json                           at the end of a run with a stall: the rank's collectives since
#                                                   (its recorder's ring, distdoctor.collectives/1)
#   trace.json, report.html                         rank 0, at the end of a run with a stall: the run as a picture
#                                                   (distdoctor.timeline: Perfetto's trace, the HTML report)
#   slow_ranks.json                                 rank 0, at the end of a run whose pace it judged (a slow rank,
#                                                   the spread, contention): every rank's waits and profile
#                                                   (embedded.guard.pace); the run is drawn then too
# torch's own analyzer reads the last folder:
#   python -m torch.distributed.flight_recorder.fr_trace DIR/flight_recorder --prefix distdoctor_fr_rank_

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

FR_DIR = "flight_recorder"
FR_PREFIX = "distdoctor_fr_rank_"
SNAPSHOT_DIR = "snapshots"


_UNWRITABLE: set[str] = set()  # a report directory that cannot be written is said once per file


def _write(path: Path, data: bytes) -> Path | None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        return path
    except OSError as exc:
        if str(path) not in _UNWRITABLE:
            _UNWRITABLE.add(str(path))
            try:
                sys.stderr.write(f"distdoctor guard: cannot write {path}: {exc.strerror or exc}\n")
            except Exception:
                pass
        return None


def leave(report_dir: str | None, rank: int, snapshot: dict[str, Any], flight: Any) -> None:
    """This rank's snapshot and its flight-recorder dump (when the recorder has one)."""
    if not report_dir:
        return
    root = Path(report_dir)
    _write(root / SNAPSHOT_DIR / f"rank{rank}.json", (json.dumps(snapshot, indent=1, default=str) + "\n").encode())
    dump = flight.torch_dump() if flight is not None else None
    if dump:
        _write(root / FR_DIR / f"{FR_PREFIX}{rank}", dump)


def note(report_dir: str | None, rank: int, line: str) -> bool:
    """One line in the rank's guard log (distdoctor-guard-rank<N>.log); False when there is no report
    directory or it cannot be written (the caller says the line elsewhere)."""
    if not report_dir:
        return False
    try:
        root = Path(report_dir)
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f"distdoctor-guard-rank{rank}.log", "a", encoding="utf-8") as log:
            log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")
        return True
    except OSError:
        return False


def write_report(report_dir: str | None, rank: int, kind: str, report: Any) -> Path | None:
    if not report_dir:
        return None
    path = Path(report_dir) / f"distdoctor-guard-{kind}-rank{rank}-{os.getpid()}.json"
    return _write(path, (json.dumps(report.to_dict(), indent=2, default=str) + "\n").encode())


def write_document(report_dir: str | None, name: str, document: Any) -> Path | None:
    """A JSON document of the run (slow_ranks.json) in the report directory."""
    if not report_dir:
        return None
    return _write(Path(report_dir) / name, (json.dumps(document, default=str) + "\n").encode())


def write_stalls(report_dir: str | None, document: list[dict[str, Any]]) -> Path | None:
    """stalls.json: one object per stall episode (see embedded.guard.episodes)."""
    if not report_dir:
        return None
    return _write(Path(report_dir) / "stalls.json", (json.dumps(document, indent=1, default=str) + "\n").encode())


# How long rank 0 waits, at the end of a run, for the collectives of the ranks that were in a stall
# (each writes them at its own exit); a rank whose file has not come by then is drawn from its
# stall-time dump, and the trace says what it lacks.
END_WAIT_S = 3.0
_ENTRY_KEYS = ("record_id", "pg_id", "process_group", "thread_id", "thread_name", "collective_seq_id", "p2p_seq_id",
               "op_id", "profiling_name", "time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns",
               "duration_ms", "input_sizes", "input_dtypes", "state", "retired", "is_p2p")


def finish(report_dir: str | None, rank: int, world: int, flight: Any, saw_stalls: bool) -> None:
    """The end of a guarded run: a rank that was in a stall leaves its collectives; rank 0 then draws
    the run (trace.json, report.html). Never raises: a picture that cannot be drawn is said in one line."""
    if not report_dir:
        return
    try:
        left = saw_stalls and _leave_collectives(Path(report_dir), rank, flight, _kept(world))
        judged = (Path(report_dir) / "slow_ranks.json").exists()  # the pace's verdict (embedded.guard.pace)
        if rank == 0 and (saw_stalls or judged or (Path(report_dir) / "stalls.json").exists()):
            if left:  # without a recorder here (an old torch, TORCH_FR_BUFFER_SIZE=0), none will come
                _await_collectives(Path(report_dir), time.monotonic() + END_WAIT_S)
            draw(Path(report_dir))
    except Exception as exc:  # the pictures are a convenience: the run's evidence is already written
        try:
            sys.stderr.write(f"distdoctor guard (rank {rank}): could not draw the run in {report_dir}: "
                             f"{type(exc).__name__}: {str(exc)[:200]}\n")
        except Exception:
            pass


def _kept(world: int) -> int:
    """How many of its newest entries a rank leaves: what the trace draws of it (timeline.trace's budget)."""
    from distdoctor.timeline.trace import MAX_COLLECTIVE_SPANS, MIN_PER_RANK  # only at the end of a run with a stall

    return max(MIN_PER_RANK, MAX_COLLECTIVE_SPANS // max(1, world))


def _leave_collectives(root: Path, rank: int, flight: Any, kept: int) -> bool:
    """timeline/rank<R>.json: this rank's newest `kept` recorder entries; False when it has no recorder."""
    from distdoctor.diagnosis.flight_recorder import load_pickled  # only at the end of a run with a stall

    raw = flight.torch_dump() if flight is not None else None
    if not raw:
        return False
    dump = load_pickled(raw)
    entries = [{k: e.get(k) for k in _ENTRY_KEYS if k in e} for e in (dump.get("entries") or [])[-kept:]
               if isinstance(e, dict)]
    document = {"schema": "distdoctor.collectives/1", "rank": rank, "host": socket.gethostname(), "pid": os.getpid(),
                "written_at": time.time(), "flight_recorder": {"version": dump.get("version"),
                                                               "pg_config": dump.get("pg_config"),
                                                               "pg_status": dump.get("pg_status"), "entries": entries}}
    return _write(root / "timeline" / f"rank{rank}.json", (json.dumps(document, default=str) + "\n").encode()) is not None


def _await_collectives(root: Path, deadline: float) -> None:
    """Until every rank that left a snapshot in this run has left its collectives after it, or the deadline."""
    while True:
        missing = []
        for snap in (root / SNAPSHOT_DIR).glob("rank*.json"):
            mine = root / "timeline" / f"{snap.stem}.json"
            try:
                if not mine.exists() or mine.stat().st_mtime < snap.stat().st_mtime:
                    missing.append(mine)
            except OSError:
                continue
        if not missing or time.monotonic() >= deadline:
            return
        time.sleep(0.1)


def draw(root: Path) -> None:
    """trace.json and report.html of the report directory, from what it holds now."""
    from distdoctor.timeline.html_run import run_page  # the pictures' code loads only at the end of a run with a stall
    from distdoctor.timeline.job_report import job_report
    from distdoctor.timeline.material import read_material
    from distdoctor.timeline.trace import build_trace, collective_spans

    material = read_material([root])
    collectives = collective_spans(material)
    _write(root / "trace.json", json.dumps(build_trace(material, collectives), separators=(",", ":")).encode())
    _write(root / "report.html", run_page(job_report(material, collectives), title="distdoctor guard: the run").encode())
