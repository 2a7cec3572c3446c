"""Unit tests of the DDP set-up checks (no process group needed; GPU placement with stand-ins)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, IterableDataset, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

from distdoctor.embedded import setup_checks as pc  # noqa: E402
from distdoctor.embedded.preflight import _apply_delta, _delta  # noqa: E402
from distdoctor.checks._support.tensor_specs import SpecTable, compare_tables, spec_table  # noqa: E402


class FakeModule:
    """A module whose parameters report chosen devices (no GPU on the test machine)."""

    def __init__(self, devices):
        self._params = [(f"p{i}", SimpleNamespace(device=d)) for i, d in enumerate(devices)]

    def named_parameters(self):
        return iter(self._params)

    def named_buffers(self):
        return iter(())


def ids(findings):
    return [f.id for f in findings]


def test_model_on_another_ranks_gpu():
    found = pc.model_findings(FakeModule(["cuda:0", "cuda:0"]), rank=1, world_size=2, local_rank=1,
                              backend="nccl", expected_cuda_index=1)
    assert ids(found) == ["pre.E001"]
    assert "is on cuda:0, but this rank's device is cuda:1 (LOCAL_RANK=1)" in found[0].title
    assert found[0].cause == "device_mismatch" and found[0].ranks == (1,)


def test_model_on_its_gpu_or_spread_on_purpose_is_fine():
    ok = dict(rank=1, world_size=2, local_rank=1, backend="nccl", expected_cuda_index=1)
    assert pc.model_findings(FakeModule(["cuda:1"]), **ok) == []
    assert pc.model_findings(FakeModule(["cuda:0", "cuda:1"]), **ok) == []  # model parallel


def test_cpu_model_on_nccl_group():
    found = pc.model_findings(FakeModule(["cpu"]), rank=0, world_size=2, local_rank=0, backend="nccl",
                              expected_cuda_index=0)
    assert ids(found) == ["pre.E005"] and found[0].cause == "cpu_tensor_on_nccl"
    # a mixed backend serves CPU tensors with gloo
    assert pc.model_findings(FakeModule(["cpu"]), rank=0, world_size=2, local_rank=0,
                             backend="cpu:gloo,cuda:nccl", expected_cuda_index=0) == []
    assert pc.model_findings(FakeModule(["cpu"]), rank=0, world_size=2, local_rank=0, backend="gloo",
                             expected_cuda_index=None) == []


def test_cpu_tensors_for_nccl():
    found = pc.tensors_findings({"labels": torch.zeros(2)}, rank=0, backend="nccl", local_rank=0,
                                expected_cuda_index=0)
    assert ids(found) == ["pre.E005"] and "tensors['labels']" in found[0].detail


def test_dataparallel_in_multiprocess_job():
    model = nn.DataParallel(nn.Linear(2, 2))
    assert ids(pc.model_findings(model, rank=0, world_size=2, local_rank=0, backend="gloo",
                                 expected_cuda_index=None)) == ["pre.E002"]
    assert pc.model_findings(model, rank=0, world_size=1, local_rank=0, backend="gloo",
                             expected_cuda_index=None) == []


def test_unwrap_and_specs_use_the_users_names():
    inner = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    wrapped = nn.DataParallel(inner)
    assert pc.wrappers_of(wrapped) == ["DataParallel"] and pc.unwrap(wrapped) is inner
    names = [s.name for s in pc.model_spec_table(wrapped, 1024)]
    assert names == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                     "1.num_batches_tracked"]


def test_sampler_checks():
    data = TensorDataset(torch.arange(10.0))
    assert ids(pc.dataloader_findings(DataLoader(data), rank=0, world_size=2)) == ["pre.W003"]
    good = DataLoader(data, sampler=DistributedSampler(data, num_replicas=2, rank=1))
    assert pc.dataloader_findings(good, rank=1, world_size=2) == []
    wrong = DataLoader(data, sampler=DistributedSampler(data, num_replicas=8, rank=0))
    (f,) = pc.dataloader_findings(wrong, rank=1, world_size=2)
    assert f.id == "pre.E004" and "num_replicas=8 but the group has 2 ranks" in f.title
    assert "not the process's own rank" in f.title
    # single process: nothing to shard
    assert pc.dataloader_findings(DataLoader(data), rank=0, world_size=1) == []


def test_iterable_dataset_is_not_judged():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    loader = DataLoader(Stream())
    assert pc.dataloader_findings(loader, rank=0, world_size=2) == []
    assert pc.batch_count(loader) is None


def test_batch_counts():
    assert pc.batch_count_findings({0: 5, 1: 5}) == []
    (f,) = pc.batch_count_findings({0: 5, 1: 6, 2: 5, 3: 7})
    assert f.id == "pre.E006" and f.ranks == (1, 3)
    assert "ranks 0, 2: 5 batches; rank 1: 6 batches; rank 3: 7 batches" in f.title
    (unknown,) = pc.batch_count_findings({0: 5, 1: None})
    assert unknown.id == "pre.I007" and unknown.ranks == (1,)


def test_versions():
    assert pc.version_findings({"torch": "2.13.0", "cuda": None}, {"torch": "2.13.0", "cuda": None}, 1) == []
    (f,) = pc.version_findings({"torch": "2.12.0", "cuda": None}, {"torch": "2.13.0", "cuda": None}, 3)
    assert f.id == "pre.E010" and f.ranks == (3,) and "torch 2.12.0 (rank 0: 2.13.0)" in f.title


def test_delta_round_trip_rebuilds_the_rank_table():
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    torch.manual_seed(1)
    b = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2), nn.Linear(2, 2))
    ref, mine = spec_table(a.named_parameters()), spec_table(b.named_parameters())
    delta = _delta(ref, mine, 1e-6)
    assert {row[0] for row in delta["changed"]} == {s.name for s in mine}
    rebuilt = _apply_delta(ref, delta)
    assert compare_tables({0: ref, 1: rebuilt}) == compare_tables({0: ref, 1: mine})
    assert _delta(ref, ref, 1e-6) == {}
    # a tensor missing on this rank is carried as a name
    fewer = SpecTable(ref.specs[1:])
    assert _delta(ref, fewer, 1e-6) == {"changed": [], "missing": ["0.weight"]}


def test_preflight_without_a_group_raises_pg_not_initialized():
    import distdoctor

    with pytest.raises(distdoctor.PreflightError) as info:
        distdoctor.preflight(model=nn.Linear(2, 2))
    assert isinstance(info.value, RuntimeError)
    assert ids(info.value.report.findings) == ["pre.C008"]
    assert "pre.C008 [pg_not_initialized]" in str(info.value)


def test_import_distdoctor_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, distdoctor; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_preflight_rejects_what_it_cannot_fingerprint(monkeypatch):
    import torch.distributed as dist

    import distdoctor

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    with pytest.raises(TypeError, match="expects a torch.nn.Module, got int"):
        distdoctor.preflight(model=3)
    with pytest.raises(TypeError, match="not a tensor: 'lr'"):
        distdoctor.preflight(tensors={"lr": 0.1, "w": torch.zeros(1)})
