"""A call record and its recent call sites as bytes, for the exchange after a mismatch."""

from __future__ import annotations

import json

from distdoctor.embedded.guard.record import CallRecord


def record_to_bytes(record: CallRecord, recent: list[str]) -> bytes:
    return json.dumps({"call": record.to_dict(), "recent": list(recent)}, separators=(",", ":"), default=str).encode()


def record_from_bytes(data: bytes) -> tuple[CallRecord, list[str]]:
    raw = json.loads(data)
    return CallRecord.from_dict(raw["call"]), [str(s) for s in raw.get("recent", ())]
