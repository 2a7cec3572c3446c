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
# torch's own analyzer reads the last folder:
#   python -m torch.distributed.flight_recorder.fr_trace DIR/flight_recorder --prefix distdoctor_fr_rank_

from __future__ import annotations

import json
import os
import sys
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


def write_report(report_dir: str | None, rank: int, kind: str, report: Any) -> Path | None:
    if not report_dir:
        return None
    path = Path(report_dir) / f"distdoctor-guard-{kind}-rank{rank}-{os.getpid()}.json"
    return _write(path, (json.dumps(report.to_dict(), indent=2, default=str) + "\n").encode())


def write_stalls(report_dir: str | None, document: list[dict[str, Any]]) -> Path | None:
    """stalls.json: one object per stall episode (see embedded.guard.episodes)."""
    if not report_dir:
        return None
    return _write(Path(report_dir) / "stalls.json", (json.dumps(document, indent=1, default=str) + "\n").encode())
