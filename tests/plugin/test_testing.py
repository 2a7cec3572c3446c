"""distdoctor.testing.run_distributed without pytest in between, and marker corner cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from distdoctor.testing import STATUS_DIED, STATUS_KILLED, run_distributed

pytestmark = pytest.mark.multiproc
BODIES = str(Path(__file__).with_name("rank_bodies.py"))


def test_a_rank_that_dies_is_reported_with_its_exit_code():
    result = run_distributed("rank_bodies:rank_one_dies", module_file=BODIES, world_size=2, timeout=60, grace=2)
    assert not result.ok and result.leftover == []
    assert result.ranks[1].status == STATUS_DIED and result.ranks[1].exitcode == 3
    # rank 0 was blocked in the barrier with the dead rank: failed or killed, never left running
    assert result.ranks[0].status in ("failed", STATUS_KILLED)
    assert "Rank 1 died without reporting a result (rank 1: exit code 3)" in result.failure_message()


def test_three_ranks_see_the_launcher_environment():
    result = run_distributed("rank_bodies:sees_launcher_env", module_file=BODIES, world_size=3, timeout=90)
    assert result.ok, result.failure_message()


def test_ranks_run_one_intra_op_thread_as_under_torchrun(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    result = run_distributed("rank_bodies:runs_intra_op_threads", module_file=BODIES, world_size=2, timeout=90, args=(1,))
    assert result.ok, result.failure_message()


def test_the_callers_own_thread_count_is_kept():
    result = run_distributed("rank_bodies:runs_intra_op_threads", module_file=BODIES, world_size=2, timeout=90,
                             args=(2,), env={"OMP_NUM_THREADS": "2"})
    assert result.ok, result.failure_message()


def test_no_rank_leaves_before_every_rank_has_finished():
    result = run_distributed("rank_bodies:last_to_finish_sees_every_peer_alive", module_file=BODIES, world_size=3, timeout=90)
    assert result.ok, result.failure_message()


def test_local_functions_are_refused():
    def inner():
        pass

    with pytest.raises(ValueError, match="module-level function"):
        run_distributed(inner)
    with pytest.raises(ValueError, match="module:function"):
        run_distributed("no_colon")


def test_marker_on_a_class_method_and_skip(pytester: pytest.Pytester):
    pytester.makepyfile(test_user='''
import pytest
import torch.distributed as dist


class TestRanks:
    @pytest.mark.distributed(world_size=2, timeout=60)
    def test_method(self):
        assert dist.get_world_size() == 2

    @pytest.mark.distributed(world_size=2, timeout=60)
    def test_skips_everywhere(self):
        pytest.skip("not on this machine")
''')
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*not on this machine*"])
