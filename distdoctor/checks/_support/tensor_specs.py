"""Compact specs of named tensors, and their comparison across ranks.

A :class:`TensorSpec` is what one rank knows about one named tensor: shape, dtype, device type
and a cheap value fingerprint. A :class:`SpecTable` holds a rank's specs in order; it encodes to
a small JSON-able dict so that ranks can exchange it (never pickle), and
:func:`compare_tables` turns the per-rank tables (rank -> table) into findings that name the
tensor and the ranks that differ from the reference rank (rank 0).

The value fingerprint (``checksum``) is ``(sum, sum of squares)`` in float64 over a
deterministic strided sample of the flattened tensor: at most ``max_samples`` elements
(default 1024), taken every ``ceil(numel / max_samples)``-th element, so its cost is bounded
per tensor whatever the model's size, and the same elements are sampled on every rank when
shapes agree. Samples are batched per (device, dtype) and reduced with a few kernels, so a
model with 10k parameters costs a handful of kernel launches and one host sync per batch.

Why a float fingerprint compared with a tolerance rather than a hash: a hash of the bytes
flags any bit difference, including reduction-order noise when the same values are summed
on different hardware; the sums are compared with a relative tolerance (``rtol``, default
1e-6; noise of a float64 reduction over <= 1024 values is ~1e-12) that is far below what an
unsynchronised initialisation produces (O(1) relative difference). What it is not: a proof
of bitwise equality. A difference confined to elements outside the sample (e.g. one row of
a large matrix), or one that changes the sums by less than ``rtol``, is not seen; pass
``max_samples=None`` to fingerprint every element.

Tensors whose values cannot be compared meaningfully get no checksum and a ``note`` saying
why: sharded tensors (DTensor, e.g. FSDP2's parameters: each rank holds a different shard;
the global shape is compared), sparse and quantized tensors, and tensors on the meta device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

from distdoctor.core.findings import Finding
from distdoctor.core.registry import finding_kind
from distdoctor.core.report import format_ranks

FORMAT = "distdoctor.tensorspec/1"
DEFAULT_MAX_SAMPLES = 1024
DEFAULT_RTOL = 1e-6
# Samples are reduced in batches of at most this many elements (8 bytes each in float64),
# so fingerprinting a model never allocates more than ~32 MiB at once.
_BATCH_ELEMENTS = 1 << 22
# How many tensors a finding lists by name in its detail and data (the count is always exact).
LIST_LIMIT = 20

# Notes of tensors without a checksum (values not compared).
NOTE_SHARDED = "sharded (DTensor): each rank holds a different shard; values not compared"
NOTE_META = "on the meta device: no values"
NOTE_SPARSE = "not a strided tensor (sparse or other layout): values not compared"
NOTE_QUANTIZED = "quantized: values not compared"

SPEC_SHAPE = finding_kind(
    "spec.E001",
    cause="shape_mismatch",
    title="A tensor has a different shape on some ranks",
    hint="Build the model identically on every rank (same config, same width); check rank-dependent code paths",
)
SPEC_DTYPE = finding_kind(
    "spec.E002",
    cause="dtype_mismatch",
    title="A tensor has a different dtype on some ranks",
    hint="Cast the model the same way on every rank (model.float() / .to(dtype)) before wrapping it",
)
SPEC_DEVICE = finding_kind(
    "spec.E003",
    cause="device_mismatch",
    title="A tensor sits on a different device type on some ranks",
    hint="Move the model to the same device type on every rank: model.to(torch.device('cuda', local_rank))",
)
SPEC_VALUES = finding_kind(
    "spec.E004",
    cause="param_divergence",
    title="A tensor has different values on some ranks (unsynchronised initialisation)",
    hint="Seed every rank identically (torch.manual_seed) or wrap the model in DDP, which broadcasts rank 0's weights",
)
SPEC_VALUES_BEFORE_WRAP = finding_kind(
    "spec.I007",
    cause="param_divergence",
    title="Parameter values differ across ranks before the DDP/FSDP wrap (expected: the wrap broadcasts rank 0's)",
    hint="Nothing to do if the model is wrapped in DDP/FSDP after preflight; seed every rank identically to compare values",
)
SPEC_PRESENCE = finding_kind(
    "spec.E005",
    cause="shape_mismatch",
    title="A tensor exists on some ranks only",
    hint="Build the same modules on every rank; a rank-dependent branch adds or drops a layer",
)
SPEC_NOT_COMPARED = finding_kind(
    "spec.I006",
    cause="param_divergence",
    title="Some tensors' values could not be compared across ranks",
    hint="Nothing to do; compare the full (unsharded) tensors if their values must be checked",
)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    # (sum, sum of squares) in float64 over `sampled` elements; None when not comparable.
    checksum: tuple[float, float] | None = None
    sampled: int = 0
    note: str = ""

    def to_row(self) -> list[Any]:
        row: list[Any] = [self.name, list(self.shape), self.dtype, self.device]
        if self.checksum is not None:
            row += [self.sampled, _encode_float(self.checksum[0]), _encode_float(self.checksum[1])]
        else:
            row += [0, None, None]
        if self.note:
            row.append(self.note)
        return row

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> "TensorSpec":
        if not isinstance(row, (list, tuple)) or len(row) < 7:
            raise ValueError(f"malformed tensor spec row: {row!r}")
        name, shape, dtype, device, sampled, s1, s2 = row[:7]
        checksum = None if s1 is None or s2 is None else (_decode_float(s1), _decode_float(s2))
        return cls(
            name=str(name),
            shape=tuple(int(d) for d in shape),
            dtype=str(dtype),
            device=str(device),
            checksum=checksum,
            sampled=int(sampled),
            note=str(row[7]) if len(row) > 7 else "",
        )


@dataclass
class SpecTable:
    """One rank's specs, in the order they were taken (a model's parameter order)."""

    specs: list[TensorSpec] = field(default_factory=list)
    _index: dict[str, TensorSpec] | None = field(default=None, repr=False, compare=False)

    def __iter__(self) -> Iterator[TensorSpec]:
        return iter(self.specs)

    def __len__(self) -> int:
        return len(self.specs)

    def index(self) -> dict[str, TensorSpec]:
        if self._index is None:
            self._index = {s.name: s for s in self.specs}
        return self._index

    def get(self, name: str) -> TensorSpec | None:
        return self.index().get(name)

    def encode(self) -> dict[str, Any]:
        """A small JSON-able dict: one short list per tensor."""
        return {"format": FORMAT, "rows": [s.to_row() for s in self.specs]}

    @classmethod
    def decode(cls, raw: Mapping[str, Any] | "SpecTable") -> "SpecTable":
        if isinstance(raw, SpecTable):
            return raw
        if not isinstance(raw, Mapping) or raw.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} table")
        return cls([TensorSpec.from_row(r) for r in raw.get("rows", ())])

    def structure_key(self) -> tuple:
        """Everything but the values: equal keys mean the tables can be compared position by position."""
        return tuple((s.name, s.shape, s.dtype, s.device, s.sampled, s.checksum is None, s.note) for s in self.specs)

    def checksums(self) -> list[float]:
        """The fingerprints flattened (2 floats per tensor; NaN where there is none)."""
        out: list[float] = []
        for s in self.specs:
            out += list(s.checksum) if s.checksum is not None else [math.nan, math.nan]
        return out

    def with_checksums(self, values: Sequence[float]) -> "SpecTable":
        """This table's structure with another rank's fingerprints (as :meth:`checksums` gives them)."""
        if len(values) != 2 * len(self.specs):
            raise ValueError(f"expected {2 * len(self.specs)} checksum values, got {len(values)}")
        specs = []
        for i, s in enumerate(self.specs):
            if s.checksum is None:
                specs.append(s)
            else:
                specs.append(TensorSpec(s.name, s.shape, s.dtype, s.device,
                                        (float(values[2 * i]), float(values[2 * i + 1])), s.sampled, s.note))
        return SpecTable(specs)


def _encode_float(value: float) -> float | str:
    # JSON has no NaN/Infinity; keep them as strings so the encoding is strict JSON.
    return value if math.isfinite(value) else repr(value)


def _decode_float(value: Any) -> float:
    return float(value)


# -- taking specs -------------------------------------------------------------------------


def _is_dtensor(tensor: Any) -> bool:
    return hasattr(tensor, "placements") and hasattr(tensor, "to_local")


def _short_dtype(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def spec_table(named_tensors: Iterable[tuple[str, Any]], *, max_samples: int | None = DEFAULT_MAX_SAMPLES) -> SpecTable:
    """Specs of ``(name, tensor)`` pairs, with batched value fingerprints.

    ``max_samples=None`` fingerprints every element (cost: one pass over the tensors).
    """
    import torch  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

    pending: list[tuple[int, Any]] = []  # (row index, 1-D sample) of tensors that get a checksum
    rows: list[tuple[str, tuple[int, ...], str, str, str]] = []
    dtype_names: dict[Any, str] = {}
    strided = torch.strided
    with torch.no_grad():
        for name, tensor in named_tensors:
            # Attribute access on a Tensor subclass (nn.Parameter) goes through
            # __torch_function__ and costs ~10x more; detach() gives a plain view.
            sharded = _is_dtensor(tensor)
            plain = tensor if sharded else tensor.detach()
            dtype = plain.dtype
            dtype_name = dtype_names.get(dtype) or dtype_names.setdefault(dtype, _short_dtype(dtype))
            device = plain.device.type
            note = ""
            if sharded:
                note = NOTE_SHARDED
            elif device == "meta":
                note = NOTE_META
            elif plain.layout != strided:
                note = NOTE_SPARSE
            elif plain.is_quantized:
                note = NOTE_QUANTIZED
            else:
                pending.append((len(rows), _sample(plain, max_samples, torch)))
            rows.append((str(name), tuple(plain.shape), dtype_name, device, note))
        checksums = _reduce_samples(pending, torch)
    specs = []
    for i, (name, shape, dtype_name, device, note) in enumerate(rows):
        found = checksums.get(i)
        specs.append(TensorSpec(name, shape, dtype_name, device,
                                found[0] if found else None, found[1] if found else 0, note))
    return SpecTable(specs)


def _sample(tensor: Any, max_samples: int | None, torch: Any) -> Any:
    flat = tensor.reshape(-1)  # a view for contiguous tensors (parameters); a copy otherwise
    if flat.is_complex():
        flat = torch.view_as_real(flat.resolve_conj()).reshape(-1)
    numel = flat.numel()
    if max_samples is not None and numel > max_samples:
        stride = -(-numel // max_samples)
        flat = flat[::stride]
    return flat


def _reduce_samples(pending: list[tuple[int, Any]], torch: Any) -> dict[int, tuple[tuple[float, float], int]]:
    """Sum and sum of squares of every sample, batched per (device, dtype)."""
    groups: dict[tuple[Any, Any], list[tuple[int, Any]]] = {}
    for index, sample in pending:
        groups.setdefault((sample.device, sample.dtype), []).append((index, sample))
    out: dict[int, tuple[tuple[float, float], int]] = {}
    for (device, _dtype), members in groups.items():
        batch: list[tuple[int, Any]] = []
        size = 0
        for member in members:
            batch.append(member)
            size += member[1].numel()
            if size >= _BATCH_ELEMENTS:
                out.update(_reduce_batch(batch, device, torch))
                batch, size = [], 0
        if batch:
            out.update(_reduce_batch(batch, device, torch))
    return out


def _reduce_batch(batch: list[tuple[int, Any]], device: Any, torch: Any) -> dict[int, tuple[tuple[float, float], int]]:
    lengths = [s.numel() for _, s in batch]
    values = torch.cat([s for _, s in batch]).to(torch.float64)
    both = torch.stack([values, values * values], dim=1)  # [n, 2]
    lengths_t = torch.tensor(lengths, device=device)
    try:
        # One kernel for all segments; empty segments sum to the initial 0.
        sums = torch.segment_reduce(both, "sum", lengths=lengths_t, axis=0, initial=0.0).T
    except (RuntimeError, NotImplementedError):  # a device without segment_reduce
        segment = torch.repeat_interleave(torch.arange(len(batch), device=device), lengths_t)
        sums = torch.zeros(2, len(batch), dtype=torch.float64, device=device).index_add_(1, segment, both.T)
    out = sums.cpu().tolist()  # the one host sync of the batch
    return {index: ((out[0][i], out[1][i]), lengths[i]) for i, (index, _) in enumerate(batch)}


# -- comparing ---------------------------------------------------------------------------


def values_close(a: tuple[float, float], b: tuple[float, float], sampled: int, rtol: float = DEFAULT_RTOL) -> bool:
    """Whether two fingerprints of the same sample agree within the relative tolerance.

    The sum of squares is compared relative to itself; the sum relative to
    sqrt(n * sum of squares), an upper bound of sum |x|, so values that cancel out (sum ~ 0)
    are not compared against a zero scale. NaN matches only NaN, an infinity only itself.
    """
    squares = max(abs(v) for v in (a[1], b[1]) if math.isfinite(v)) if any(math.isfinite(v) for v in (a[1], b[1])) else 0.0
    scales = (math.sqrt(max(sampled, 1) * squares), squares)
    for x, y, scale in zip(a, b, scales):
        if math.isnan(x) or math.isnan(y):
            if not (math.isnan(x) and math.isnan(y)):
                return False
        elif math.isinf(x) or math.isinf(y):
            if x != y:
                return False
        elif abs(x - y) > rtol * scale:
            return False
    return True


@dataclass
class _Difference:
    """One tensor that differs: the reference's value and the other ranks' values."""

    name: str
    reference: Any
    others: dict[int, Any] = field(default_factory=dict)


def compare_tables(
    tables: Mapping[int, SpecTable | Mapping[str, Any]],
    *,
    reference: int | None = None,
    rtol: float = DEFAULT_RTOL,
    label: str = "tensor",
    check: str = "",
) -> list[Finding]:
    """Findings for the tensors that differ between the reference rank (default: rank 0, else
    the lowest rank present) and the others. Cost: O(total specs) (one dict lookup each).

    ``label`` names what the tensors are in titles ("parameter", "tensor").
    """
    decoded = {int(rank): SpecTable.decode(table) for rank, table in tables.items()}
    if not decoded:
        return []
    ref_rank = reference if reference is not None and reference in decoded else min(decoded)
    ref = decoded[ref_rank]
    ref_index = ref.index()
    order = {s.name: i for i, s in enumerate(ref.specs)}

    shape: dict[str, _Difference] = {}
    dtype: dict[str, _Difference] = {}
    device: dict[str, _Difference] = {}
    values: dict[str, _Difference] = {}
    missing: dict[str, _Difference] = {}  # on the reference, absent on others
    extra: dict[str, _Difference] = {}  # absent on the reference, present on others
    not_compared: dict[str, str] = {}

    def note(bucket: dict[str, _Difference], name: str, ref_value: Any, rank: int, value: Any) -> None:
        bucket.setdefault(name, _Difference(name, ref_value)).others[rank] = value

    for spec in ref.specs:
        if spec.checksum is None and spec.note:
            not_compared.setdefault(spec.name, spec.note)
    for rank in sorted(decoded):
        if rank == ref_rank:
            continue
        table = decoded[rank]
        index = table.index()
        for spec in table.specs:
            mine = ref_index.get(spec.name)
            if mine is None:
                note(extra, spec.name, None, rank, spec.shape)
                order.setdefault(spec.name, len(order))
                continue
            if spec.shape != mine.shape:
                note(shape, spec.name, mine.shape, rank, spec.shape)
            if spec.dtype != mine.dtype:
                note(dtype, spec.name, mine.dtype, rank, spec.dtype)
            if spec.device != mine.device:
                note(device, spec.name, mine.device, rank, spec.device)
            if spec.shape == mine.shape and spec.dtype == mine.dtype:
                if mine.checksum is not None and spec.checksum is not None and spec.sampled == mine.sampled:
                    if not values_close(mine.checksum, spec.checksum, mine.sampled, rtol):
                        note(values, spec.name, mine.checksum, rank, spec.checksum)
                elif spec.checksum is None and spec.note:
                    not_compared.setdefault(spec.name, spec.note)
        if len(index) != len(ref_index) or any(name not in index for name in ref_index):
            for name in ref_index:
                if name not in index:
                    note(missing, name, ref_index[name].shape, rank, None)

    def ordered(bucket: dict[str, _Difference]) -> list[_Difference]:
        return sorted(bucket.values(), key=lambda d: order.get(d.name, len(order)))

    findings: list[Finding] = []
    findings += _attribute_finding(SPEC_SHAPE, "shape", ordered(shape), ref_rank, label, check, _fmt_shape)
    findings += _attribute_finding(SPEC_DTYPE, "dtype", ordered(dtype), ref_rank, label, check, str)
    findings += _attribute_finding(SPEC_DEVICE, "device type", ordered(device), ref_rank, label, check, str)
    findings += _values_finding(ordered(values), ref_rank, label, check, rtol)
    findings += _presence_finding(ordered(missing), ordered(extra), ref_rank, label, check)
    if not_compared:
        findings.append(_not_compared_finding(not_compared, label, check))
    return findings


def _fmt_shape(shape: Any) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _ranks_label(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + format_ranks(ranks)


def _grouped(others: Mapping[int, Any], fmt: Any) -> str:
    """{1: [64, 16], 2: [64, 16], 3: [8, 16]} -> 'ranks 1-2: [64, 16]; rank 3: [8, 16]'."""
    by_value: dict[str, list[int]] = {}
    for rank, value in others.items():
        by_value.setdefault(fmt(value), []).append(rank)
    return "; ".join(f"{_ranks_label(ranks)}: {value}" for value, ranks in
                     sorted(by_value.items(), key=lambda kv: min(kv[1])))


def _more(count: int, label: str) -> str:
    return f" (and {count - 1} more {label}{'s' if count > 2 else ''})" if count > 1 else ""


def _attribute_finding(kind: Any, attribute: str, diffs: list[_Difference], ref_rank: int,
                       label: str, check: str, fmt: Any) -> list[Finding]:
    if not diffs:
        return []
    ranks = sorted({r for d in diffs for r in d.others})
    first = diffs[0]
    title = (f"{label.capitalize()} '{first.name}' has a different {attribute} on "
             f"{_ranks_label(first.others)} than on rank {ref_rank}{_more(len(diffs), label)}")
    lines = [f"{len(diffs)} {label}(s) differ in {attribute} from rank {ref_rank} on {_ranks_label(ranks)}:"]
    for d in diffs[:LIST_LIMIT]:
        lines.append(f"  {d.name}: rank {ref_rank}: {fmt(d.reference)}; {_grouped(d.others, fmt)}")
    if len(diffs) > LIST_LIMIT:
        lines.append(f"  ... and {len(diffs) - LIST_LIMIT} more")
    data = {
        "reference_rank": ref_rank,
        "count": len(diffs),
        "tensors": [
            {"name": d.name, "reference": _jsonable(d.reference),
             "ranks": {str(r): _jsonable(v) for r, v in sorted(d.others.items())}}
            for d in diffs[:LIST_LIMIT]
        ],
    }
    return [kind(title, detail="\n".join(lines), ranks=ranks, data=data, check=check)]


def _values_finding(diffs: list[_Difference], ref_rank: int, label: str, check: str, rtol: float) -> list[Finding]:
    if not diffs:
        return []
    ranks = sorted({r for d in diffs for r in d.others})
    first = diffs[0]
    title = (f"{label.capitalize()} '{first.name}' has different values on {_ranks_label(first.others)} "
             f"than on rank {ref_rank}{_more(len(diffs), label)}")
    lines = [
        f"{len(diffs)} {label}(s) differ in value from rank {ref_rank} on {_ranks_label(ranks)} "
        f"(fingerprint: float64 sum and sum of squares of a strided sample, relative tolerance {rtol:g}):"
    ]
    for d in diffs[:LIST_LIMIT]:
        lines.append(f"  {d.name}: sum {d.reference[0]:.6g} on rank {ref_rank}; differs on {_ranks_label(d.others)}")
    if len(diffs) > LIST_LIMIT:
        lines.append(f"  ... and {len(diffs) - LIST_LIMIT} more")
    data = {
        "reference_rank": ref_rank,
        "count": len(diffs),
        "tensors": [{"name": d.name, "ranks": sorted(d.others)} for d in diffs[:LIST_LIMIT]],
    }
    return [SPEC_VALUES(title, detail="\n".join(lines), ranks=ranks, data=data, check=check)]


def _presence_finding(missing: list[_Difference], extra: list[_Difference], ref_rank: int,
                      label: str, check: str) -> list[Finding]:
    if not missing and not extra:
        return []
    ranks = sorted({r for d in missing + extra for r in d.others})
    lines = []
    if missing:
        first = missing[0]
        title = f"{label.capitalize()} '{first.name}' exists on rank {ref_rank} but not on {_ranks_label(first.others)}"
    else:
        first = extra[0]
        title = f"{label.capitalize()} '{first.name}' exists on {_ranks_label(first.others)} but not on rank {ref_rank}"
    total = len(missing) + len(extra)
    title += _more(total, label)
    for d in missing[:LIST_LIMIT]:
        lines.append(f"  {d.name}: on rank {ref_rank}, missing on {_ranks_label(d.others)}")
    for d in extra[: max(0, LIST_LIMIT - len(missing))]:
        lines.append(f"  {d.name}: missing on rank {ref_rank}, present on {_ranks_label(d.others)}")
    if total > LIST_LIMIT:
        lines.append(f"  ... and {total - LIST_LIMIT} more")
    data = {
        "reference_rank": ref_rank,
        "count": total,
        "missing": [{"name": d.name, "ranks": sorted(d.others)} for d in missing[:LIST_LIMIT]],
        "extra": [{"name": d.name, "ranks": sorted(d.others)} for d in extra[:LIST_LIMIT]],
    }
    detail = f"{total} {label}(s) are not on every rank:\n" + "\n".join(lines)
    return [SPEC_PRESENCE(title, detail=detail, ranks=ranks, data=data, check=check)]


def _not_compared_finding(not_compared: Mapping[str, str], label: str, check: str) -> Finding:
    names = list(not_compared)
    reasons = sorted(set(not_compared.values()))
    title = f"Could not tell whether {len(names)} {label}(s) agree in value across ranks: {reasons[0]}"
    detail = "Values not compared for: " + ", ".join(names[:LIST_LIMIT])
    if len(names) > LIST_LIMIT:
        detail += f" ... and {len(names) - LIST_LIMIT} more"
    detail += "\nReasons: " + "; ".join(reasons)
    return SPEC_NOT_COMPARED(title, detail=detail, data={"count": len(names), "reasons": reasons}, check=check)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


# What spec.E004 advises when the model is already wrapped: DDP broadcast rank 0's weights at
# construction, so values that differ now were changed after the wrap.
AFTER_WRAP_ADVICE = ("The model is already wrapped (DDP broadcast rank 0's weights when it was built), so the "
                     "values changed after the wrap: look for rank-dependent code that touches parameters after "
                     "DistributedDataParallel(...) (a load_state_dict or re-initialisation on some ranks only)")


NEVER_WRAPPED_ADVICE = ("Nothing synchronises an unwrapped model's parameters: seed every rank identically "
                        "(torch.manual_seed) or broadcast rank 0's parameters (dist.broadcast) before training")


def values_findings_for_wrap(findings: Sequence[Finding], wrappers: Sequence[str], wrap: str | None) -> list[Finding]:
    """spec.E004 judged with what preflight knows about the model's wrapping.

    A plain module that will be wrapped (wrap='later', or not said): divergence is expected, DDP
    broadcasts rank 0's weights at construction -> spec.I007. A wrapped model: the advice must
    not say "wrap it in DDP". wrap='never': spec.E004 as it is (nothing will synchronise them).
    """
    wrapped = any(w in ("DistributedDataParallel", "FullyShardedDataParallel") for w in wrappers)
    out: list[Finding] = []
    for finding in findings:
        if finding.id != SPEC_VALUES.id:
            out.append(finding)
        elif wrapped:
            out.append(finding.with_(remediation=AFTER_WRAP_ADVICE))
        elif wrap != "never":
            out.append(SPEC_VALUES_BEFORE_WRAP(
                finding.title,
                detail=finding.detail + ("\nThe model is not wrapped yet: DistributedDataParallel and FSDP broadcast "
                                         "rank 0's parameters when they are built, so this difference disappears "
                                         "at the wrap. It is an error only if the model is never wrapped."),
                ranks=finding.ranks, data=dict(finding.data), check=finding.check,
            ))
        else:
            out.append(finding.with_(remediation=NEVER_WRAPPED_ADVICE))
    return out
