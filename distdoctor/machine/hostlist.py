"""SLURM's compact host lists ("node[01-04,07],gpu-a1") and task counts ("4(x2),3") expanded."""

from __future__ import annotations

# A host list longer than this is not expanded further: a real allocation has far fewer nodes,
# and the first host (all a rendezvous needs) comes first anyway.
MAX_HOSTS = 1 << 16


class HostlistError(ValueError):
    """The text is not a SLURM host list."""


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets: "a[1,2],b" -> ["a[1,2]", "b"]."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' in {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {text!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"unbalanced '[' in {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_range(spec: str, whole: str) -> list[str]:
    """"01-04" -> ["01", "02", "03", "04"] (zero padding kept), "7" -> ["7"]."""
    if "-" not in spec:
        if not (spec.isascii() and spec.isdigit()):
            raise HostlistError(f"{spec!r} is not a number in {whole!r}")
        return [spec]
    low, high = spec.split("-", 1)
    if not (low.isascii() and low.isdigit() and high.isascii() and high.isdigit()):
        raise HostlistError(f"{spec!r} is not a range of numbers in {whole!r}")
    start, end = int(low), int(high)
    if end < start:
        raise HostlistError(f"the range {spec!r} runs backwards in {whole!r}")
    if end - start >= MAX_HOSTS:
        raise HostlistError(f"the range {spec!r} in {whole!r} has more than {MAX_HOSTS} hosts")
    width = len(low)
    return [str(n).zfill(width) for n in range(start, end + 1)]


def _expand_one(item: str, whole: str) -> list[str]:
    """One top-level item: "node[01-02,07]-ib" -> node01-ib, node02-ib, node07-ib."""
    if "[" not in item:
        if "]" in item:
            raise HostlistError(f"unbalanced ']' in {whole!r}")
        return [item]
    head, rest = item.split("[", 1)
    inner, tail = rest.split("]", 1)
    numbers = [n for spec in inner.split(",") for n in _expand_range(spec.strip(), whole)]
    tails = _expand_one(tail, whole) if tail else [""]
    return [f"{head}{n}{t}" for n in numbers for t in tails]


def expand_hostlist(text: str) -> list[str]:
    """Every host of a SLURM host list, in order ("node[01-02],gpu-a1" -> node01, node02, gpu-a1).

    Accepts what `scontrol show hostnames` accepts for the usual forms: comma-separated items,
    each with bracketed ranges and single numbers (zero padding kept), several bracket groups in
    one item ("rack[1-2]-node[1-2]"), and blank-separated lists. Raises HostlistError otherwise.
    """
    hosts: list[str] = []
    for chunk in text.split():
        for item in _split_top_level(chunk):
            hosts.extend(_expand_one(item, text))
            if len(hosts) > MAX_HOSTS:
                raise HostlistError(f"{text[:80]!r} names more than {MAX_HOSTS} hosts")
    if not hosts:
        raise HostlistError("the host list is empty")
    return hosts


def expand_task_counts(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE ("4(x2),3") as one count per node: [4, 4, 3]."""
    counts: list[int] = []
    for item in text.split(","):
        item = item.strip()
        count_text, _, repeat_text = item.partition("(x")
        repeat = 1
        if repeat_text:
            if not repeat_text.endswith(")"):
                raise HostlistError(f"{item!r} is not 'N(xM)' in {text!r}")
            repeat_text = repeat_text[:-1]
            if not (repeat_text.isascii() and repeat_text.isdigit()) or len(repeat_text) > 6:
                raise HostlistError(f"{item!r} has no usable repeat count in {text!r}")
            repeat = int(repeat_text)
        if not (count_text.isascii() and count_text.isdigit()) or len(count_text) > 7:
            raise HostlistError(f"{item!r} is not a task count in {text!r}")
        counts.extend([int(count_text)] * repeat)
        if len(counts) > MAX_HOSTS:
            raise HostlistError(f"{text[:80]!r} describes more than {MAX_HOSTS} nodes")
    return counts
