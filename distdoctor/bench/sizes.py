"""Message sizes of the sweep and nccl-tests' bus-bandwidth factors, as plain arithmetic."""

from __future__ import annotations

import re

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
# Bytes per element: the sweep runs float32, as nccl-tests does by default.
ELEMENT_BYTES = 4
# nccl-tests' defaults are -b 8 -e 256M -f 2 on GPUs; a CPU (gloo) world moves data through
# memory copies and TCP, so its default stops at 16 MiB and steps by 4 to stay within seconds.
GPU_SIZES = (8, 256 * 2**20, 2)
CPU_SIZES = (8, 32 * 2**20, 4)
_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
          "G": 2**30, "GB": 2**30, "GIB": 2**30}
MAX_BYTES = 8 * 2**30


class SizeError(ValueError):
    """A --sizes or --ops value that cannot be used; the message says why."""


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw/algbw factor (doc/PERFORMANCE.md) for ``op`` on ``n`` ranks.

    The factor turns the algorithm bandwidth into the speed each link must sustain, so that
    figures for different world sizes and ops compare with the hardware's peak.
    """
    if n < 1:
        raise ValueError(f"world size must be >= 1, got {n}")
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown op {op!r}")


def element_count(op: str, size: int, n: int) -> int:
    """Elements of the largest buffer per rank for ``size`` bytes, rounded down to a multiple of
    ``n`` (as nccl-tests does) so that each rank's chunk is whole; at least one per rank."""
    del op  # every op's reported size is its largest buffer per rank (nccl-tests' "size" column)
    count = max(size // ELEMENT_BYTES, 1)
    return max(count - count % n, n)


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        raise SizeError(f"not a size: {text!r} (examples: 8, 64K, 16M, 1G)")
    value = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if not 1 <= value <= MAX_BYTES:
        raise SizeError(f"size {text!r} is outside 1 B .. 8 GiB")
    return value


def size_range(low: int, high: int, factor: int) -> tuple[int, ...]:
    if factor < 2:
        raise SizeError(f"the step factor must be >= 2, got {factor}")
    if low > high:
        raise SizeError(f"the range starts above its end ({low} > {high})")
    out = []
    size = low
    while size <= high:
        out.append(size)
        size *= factor
    return tuple(out)


def parse_sizes(text: str) -> tuple[int, ...]:
    """``8,1K,4M`` (a list) or ``8:16M[:4]`` (nccl-tests' -b/-e/-f: from, to, step factor)."""
    text = text.strip()
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise SizeError(f"a range is FROM:TO or FROM:TO:FACTOR, got {text!r}")
        factor = int(parts[2]) if len(parts) == 3 and parts[2].strip().isdigit() else None
        if len(parts) == 3 and factor is None:
            raise SizeError(f"the step factor must be a whole number, got {parts[2]!r}")
        return size_range(parse_size(parts[0]), parse_size(parts[1]), factor or 2)
    sizes = sorted({parse_size(p) for p in text.split(",") if p.strip()})
    if not sizes:
        raise SizeError("--sizes names no size")
    return tuple(sizes)


def default_sizes(on_gpu: bool) -> tuple[int, ...]:
    return size_range(*(GPU_SIZES if on_gpu else CPU_SIZES))


def parse_ops(text: str) -> tuple[str, ...]:
    names = [p.strip().replace("-", "_") for p in text.split(",") if p.strip()]
    unknown = [n for n in names if n not in OPS]
    if unknown or not names:
        raise SizeError(f"unknown op {', '.join(unknown) or '(none)'}; choose from {', '.join(OPS)}")
    return tuple(dict.fromkeys(names))


def human_bytes(size: int) -> str:
    """8B, 64K, 16M; a size that is no whole unit (rounded to a chunk per rank) stays in bytes."""
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"
