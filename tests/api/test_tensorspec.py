"""Unit tests of distdoctor.checks._support.tensor_specs: specs, encoding, comparison across rank tables."""

from __future__ import annotations

import json
import math
import time

import pytest

torch = pytest.importorskip("torch")

from distdoctor.checks._support.tensor_specs import (  # noqa: E402
    SPEC_DEVICE,
    SPEC_DTYPE,
    SPEC_NOT_COMPARED,
    SPEC_PRESENCE,
    SPEC_SHAPE,
    SPEC_VALUES,
    SpecTable,
    TensorSpec,
    compare_tables,
    spec_table,
    values_close,
)
from tests.conftest import measured_startup_s


def model(width: int = 32, seed: int = 0, dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 4)).to(dtype)


def table(m: torch.nn.Module) -> SpecTable:
    return spec_table([*m.named_parameters(), *m.named_buffers()])


def ids(findings) -> list[str]:
    return [f.id for f in findings]


def test_spec_fields_and_checksum_of_a_known_tensor():
    t = spec_table([("x", torch.arange(10.0))])
    (spec,) = t.specs
    assert spec.name == "x" and spec.shape == (10,) and spec.dtype == "float32" and spec.device == "cpu"
    assert spec.checksum == (45.0, 285.0) and spec.sampled == 10


def test_sample_is_bounded_and_deterministic():
    x = torch.randn(100_000)
    a = spec_table([("x", x)], max_samples=1000).specs[0]
    b = spec_table([("x", x.clone())], max_samples=1000).specs[0]
    assert a.sampled <= 1000 and a.checksum == b.checksum
    full = spec_table([("x", x)], max_samples=None).specs[0]
    assert full.sampled == 100_000
    assert math.isclose(full.checksum[0], float(x.double().sum()), rel_tol=1e-9, abs_tol=1e-9)


def test_special_dtypes_and_devices():
    t = spec_table([
        ("empty", torch.zeros(0)),
        ("ints", torch.ones(3, dtype=torch.int64)),
        ("flags", torch.tensor([True, False, True])),
        ("cplx", torch.tensor([1 + 2j])),
        ("half", torch.ones(4, dtype=torch.bfloat16)),
        ("meta", torch.empty(3, device="meta")),
        ("sparse", torch.eye(3).to_sparse()),
    ])
    by = t.index()
    assert by["empty"].checksum == (0.0, 0.0)
    assert by["ints"].checksum == (3.0, 3.0)
    assert by["flags"].checksum == (2.0, 2.0)
    assert by["cplx"].checksum == (3.0, 5.0)
    assert by["half"].checksum == (4.0, 4.0) and by["half"].dtype == "bfloat16"
    assert by["meta"].checksum is None and "meta" in by["meta"].note
    assert by["sparse"].checksum is None and "sparse" in by["sparse"].note


def test_encoding_is_strict_json_and_round_trips():
    t = spec_table([("w", torch.tensor([1.0, float("nan")])), ("b", torch.ones(2)), ("m", torch.empty(1, device="meta"))])
    text = json.dumps(t.encode(), allow_nan=False)
    back = SpecTable.decode(json.loads(text))
    assert [s.name for s in back] == ["w", "b", "m"]
    assert math.isnan(back.specs[0].checksum[0]) and back.specs[1] == t.specs[1] and back.specs[2] == t.specs[2]
    with pytest.raises(ValueError):
        SpecTable.decode({"rows": []})
    with pytest.raises(ValueError):
        TensorSpec.from_row(["x", [1]])


def test_identical_models_give_no_findings():
    tables = {r: table(model()).encode() for r in range(4)}
    assert compare_tables(tables) == []


def test_shape_mismatch_names_parameter_and_rank():
    tables = {0: table(model(32)), 1: table(model(32)), 2: table(model(64))}
    findings = compare_tables(tables, label="parameter")
    shape = [f for f in findings if f.id == SPEC_SHAPE.id]
    assert len(shape) == 1
    f = shape[0]
    assert f.cause == "shape_mismatch" and f.ranks == (2,)
    assert "'0.weight'" in f.title and "rank 2" in f.title
    assert "0.weight: rank 0: [32, 8]; rank 2: [64, 8]" in f.detail
    assert f.data["tensors"][0]["ranks"] == {"2": [64, 8]}
    # Values of tensors whose shapes differ are not compared (2.bias keeps its shape but got
    # other random values, since the wider layer drew more numbers from the generator).
    values = [f for f in findings if f.id == SPEC_VALUES.id]
    assert [t["name"] for t in values[0].data["tensors"]] == ["2.bias"]


def test_dtype_mismatch():
    findings = compare_tables({0: table(model()), 1: table(model(dtype=torch.float64))})
    assert ids(findings) == [SPEC_DTYPE.id]
    assert findings[0].cause == "dtype_mismatch" and findings[0].ranks == (1,)
    assert "float32" in findings[0].detail and "float64" in findings[0].detail


def test_device_mismatch_across_ranks():
    a = table(model())
    b = SpecTable([TensorSpec(s.name, s.shape, s.dtype, "cuda", s.checksum, s.sampled) for s in a])
    findings = compare_tables({0: a, 1: b})
    assert ids(findings) == [SPEC_DEVICE.id] and findings[0].cause == "device_mismatch"


def test_param_divergence_from_different_seeds():
    findings = compare_tables({0: table(model(seed=0)), 1: table(model(seed=0)), 2: table(model(seed=1))})
    assert ids(findings) == [SPEC_VALUES.id]
    f = findings[0]
    assert f.cause == "param_divergence" and f.ranks == (2,) and "'0.weight'" in f.title
    assert f.data["count"] == 4


def test_reduction_noise_is_tolerated_but_real_change_is_not():
    x = torch.randn(1000, dtype=torch.float64)
    a = spec_table([("x", x)]).specs[0]
    # The same values summed in another order: float64 reduction noise.
    shuffled = x[torch.randperm(1000)]
    b_sum = float(shuffled.sum()), float((shuffled * shuffled).sum())
    assert values_close(a.checksum, b_sum, a.sampled)
    y = x.clone()
    y[0] += 1e-2
    c = spec_table([("x", y)]).specs[0]
    assert not values_close(a.checksum, c.checksum, a.sampled)
    nan = (float("nan"), float("nan"))
    assert values_close(nan, nan, 1) and not values_close(nan, (1.0, 1.0), 1)
    assert not values_close((float("inf"), 1.0), (1.0, 1.0), 1)


def test_presence_both_directions():
    a = table(model())
    extra = SpecTable([*a.specs, TensorSpec("extra.weight", (2,), "float32", "cpu", (0.0, 0.0), 2)])
    missing = SpecTable(a.specs[1:])
    findings = compare_tables({0: a, 1: missing, 2: extra})
    (f,) = findings
    assert f.id == SPEC_PRESENCE.id and f.ranks == (1, 2)
    assert "'0.weight' exists on rank 0 but not on rank 1" in f.title
    assert "extra.weight: missing on rank 0, present on rank 2" in f.detail


def test_reference_falls_back_to_lowest_rank():
    findings = compare_tables({3: table(model(32)), 5: table(model(64))})
    assert findings[0].ranks == (5,) and "than on rank 3" in findings[0].title


def test_sharded_tensors_are_not_compared_and_say_so():
    a = SpecTable([TensorSpec("w", (8,), "float32", "cuda", None, 0, "sharded (DTensor): values not compared")])
    findings = compare_tables({0: a, 1: a})
    assert ids(findings) == [SPEC_NOT_COMPARED.id]
    assert "Could not tell" in findings[0].title


def test_with_checksums_rebuilds_other_rank_table():
    a, b = table(model(seed=0)), table(model(seed=1))
    rebuilt = a.with_checksums(b.checksums())
    assert rebuilt.structure_key() == a.structure_key()
    assert [s.checksum for s in rebuilt] == [s.checksum for s in b]


def test_many_findings_are_capped_but_counted():
    a = SpecTable([TensorSpec(f"p{i}", (1,), "float32", "cpu", (1.0, 1.0), 1) for i in range(100)])
    b = SpecTable([TensorSpec(f"p{i}", (2,), "float32", "cpu", (1.0, 1.0), 1) for i in range(100)])
    (f,) = compare_tables({0: a, 1: b})
    assert f.data["count"] == 100 and len(f.data["tensors"]) == 20 and "and 80 more" in f.detail


def test_comparison_is_linear_in_specs():
    # 10k tensors x 32 ranks: one pass with dict lookups, well under the deadlines of preflight.
    specs = [TensorSpec(f"layer{i}.weight", (64, 64), "float32", "cpu", (float(i), 1.0), 1024) for i in range(10_000)]
    t = SpecTable(specs)
    start = time.perf_counter()
    assert compare_tables({r: t for r in range(32)}) == []
    assert time.perf_counter() - start < 10 + measured_startup_s()  # a loaded machine is slower
