"""@pytest.mark.distributed runs its body with the guard on: a mismatch or a hang fails with its cause."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.multiproc

MISMATCH_AND_HANG = '''
import time

import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2, timeout=60)
def test_broadcast_with_rank_dependent_shape():
    t = torch.zeros(2, 3) if dist.get_rank() == 0 else torch.zeros(3, 2)
    dist.broadcast(t, src=0)


@pytest.mark.distributed(world_size=2, timeout=20)
def test_rank_one_is_late():
    if dist.get_rank() == 1:
        time.sleep(30)
    dist.barrier()


@pytest.mark.distributed(world_size=2, timeout=60, guard=False)
def test_without_the_guard_the_mismatch_goes_through():
    t = torch.zeros(2, 3) if dist.get_rank() == 0 else torch.zeros(3, 2)
    dist.broadcast(t, src=0)   # gloo moves 6 floats either way: no error
'''


def test_the_marker_names_the_cause_instead_of_a_timeout(pytester: pytest.Pytester):
    pytester.makepyfile(test_user=MISMATCH_AND_HANG)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", timeout=240)
    result.assert_outcomes(failed=2, passed=1)
    text = result.stdout.str()
    assert "GuardError" in text and "guard.E001 [shape_mismatch] broadcast #0" in text, text
    # timeout=20: the guard's hang timeout is 4 s; its verdict, confirmed by the ranks that answered, ends the
    # ranks long before the sleeper would arrive (30 s): the rank fails with the guard's report.
    assert "job.E002 [straggler_rank] Rank 1 has not arrived at " in text, text
    assert "did not finish within the 20 s timeout" not in text, text
