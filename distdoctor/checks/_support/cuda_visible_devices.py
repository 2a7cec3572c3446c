"""CUDA_VISIBLE_DEVICES, parsed the way the CUDA runtime (and torch.cuda) reads it.

Rules (torch/cuda/__init__.py ``_parse_visible_devices`` mirrors the driver):
  - unset: every GPU is visible;
  - a list that starts with "GPU-" is a list of UUID prefixes, one starting with "MIG-" a list of
    MIG instances; the first entry without that prefix ends the list;
  - otherwise entries are read like strtoul ("1gpu2" is 1); the first entry that is not a
    non-negative number ends the list, so "0,x,1" is just GPU 0 and "" or "-1" hides every GPU;
  - a repeated entry makes the whole list empty (no GPU at all).
Everything after the point where CUDA stops reading is silently ignored, which is why this
module reports it: "0,1,,2" gives two GPUs, not three.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.checks._support.c_integers import leading_int

INDICES = "indices"
UUIDS = "uuids"
MIG = "mig"
ALL = "all"


@dataclass(frozen=True)
class VisibleDevices:
    raw: str | None
    form: str  # ALL (unset), INDICES, UUIDS or MIG
    devices: tuple[int | str, ...]  # what CUDA will expose, in order
    ignored: tuple[str, ...] = ()  # entries CUDA drops (after the first unusable one)
    problems: tuple[str, ...] = ()
    duplicates: tuple[str, ...] = ()  # repeated entries (they empty the whole list)

    @property
    def restricted(self) -> bool:
        return self.form != ALL

    @property
    def count(self) -> int | None:
        """How many GPUs at most CUDA exposes; None when unset (all of them)."""
        return None if self.form == ALL else len(self.devices)

    @property
    def hides_all(self) -> bool:
        return self.form != ALL and not self.devices


def _strtoul(text: str) -> int:
    """torch's _strtoul: the leading (optionally signed) digits, or -1 when there are none."""
    value = leading_int(text)
    return -1 if value is None else value


def parse(raw: str | None) -> VisibleDevices:
    if raw is None:
        return VisibleDevices(None, ALL, ())
    entries = raw.split(",")
    if raw.startswith(("GPU-", "MIG-")):
        prefix = raw[:4]
        form = UUIDS if prefix == "GPU-" else MIG
        kept: list[str] = []
        for i, entry in enumerate(entries):
            if entry in kept:
                return VisibleDevices(raw, form, (), problems=(f"{entry!r} is listed twice, which hides every GPU",), duplicates=(entry,))
            if not entry.startswith(prefix):
                rest = tuple(entries[i:])
                return VisibleDevices(
                    raw, form, tuple(kept), ignored=rest,
                    problems=(f"{entry!r} does not start with {prefix!r}: CUDA stops reading there and ignores {', '.join(map(repr, rest))}",),
                )
            kept.append(entry)
        return VisibleDevices(raw, form, tuple(kept))

    indices: list[int] = []
    problems: list[str] = []
    for i, entry in enumerate(entries):
        value = _strtoul(entry.strip())
        if value in indices:
            return VisibleDevices(raw, INDICES, (), problems=(f"GPU {value} is listed twice, which hides every GPU",), duplicates=(entry,))
        if value < 0:
            rest = tuple(entries[i:])
            if raw.strip() == "" or raw.strip() == "-1" or (i == 0 and entry.strip() in ("", "-1") and len(entries) == 1):
                # The documented way to hide every GPU: not a mistake in itself.
                return VisibleDevices(raw, INDICES, (), ignored=())
            what = "an empty entry" if not entry.strip() else f"{entry!r} is not a GPU index"
            problems.append(f"{what}: CUDA stops reading there and ignores {', '.join(map(repr, rest))}")
            return VisibleDevices(raw, INDICES, tuple(indices), ignored=rest, problems=tuple(problems))
        if entry.strip() != str(value):
            problems.append(f"{entry!r} is read as GPU {value} (CUDA reads the leading digits only)")
        indices.append(value)
    return VisibleDevices(raw, INDICES, tuple(indices), problems=tuple(problems))
