"""A test body run on 2 ranks by distdoctor's pytest marker, for the compatibility matrix."""

import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2, backend="gloo", timeout=90)
def test_all_reduce_sums_over_ranks():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    assert t.item() == 3.0
