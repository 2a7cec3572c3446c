import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2, backend="gloo", timeout=60)
def test_all_reduce_sums_over_ranks():
    # Runs in 2 processes; the process group is already initialized.
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    assert t.item() == 3.0


@pytest.mark.distributed(world_size=2)
@pytest.mark.parametrize("size", [1, 3])
def test_broadcast_from_rank_0(size, tmp_path):
    # Fixture and parameter values are computed once and sent to every rank.
    t = torch.arange(size, dtype=torch.float32) if dist.get_rank() == 0 else torch.zeros(size)
    dist.broadcast(t, src=0)
    assert t.tolist() == list(range(size))


def test_distdoctor_report(distdoctor_report):
    # The session's distdoctor report (checks run once, on first use).
    assert distdoctor_report.status in ("ok", "warning", "error")
