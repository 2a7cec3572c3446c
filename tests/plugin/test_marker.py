"""@pytest.mark.distributed in a user's suite, run for real: 2 gloo ranks on loopback per test."""

from __future__ import annotations

import time

import psutil
import pytest

from tests.conftest import measured_startup_s, recent_startup_s, slack_s

pytestmark = pytest.mark.multiproc

PASSING = '''
import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2, timeout=60)
def test_all_reduce_sums_ranks():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    assert dist.get_world_size() == 2
    assert t.item() == 3.0


@pytest.mark.distributed(world_size=2, timeout=60)
@pytest.mark.parametrize("scale", [2])
def test_fixture_values_reach_the_ranks(scale, tmp_path):
    # Fixture and parameter values are computed in pytest's process and sent to the ranks.
    (tmp_path / f"rank{dist.get_rank()}").write_text(str(scale * dist.get_rank()))
    dist.barrier()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]


def test_plain_tests_still_run_in_process():
    assert True
'''

FAILING_RANK = '''
import pytest
import torch.distributed as dist


def check_input(value):
    if dist.get_rank() == 1:
        raise ValueError(f"rank 1 got a bad value: {value}")


@pytest.mark.distributed(world_size=2, timeout=60)
def test_rank_one_fails():
    check_input(41)
    dist.barrier()
'''

HANGING_RANK = '''
import os
import subprocess
import sys
import tempfile
import time

import pytest
import torch.distributed as dist


@pytest.mark.distributed(world_size=2, timeout={timeout})
def test_rank_one_hangs():
    if dist.get_rank() == 1:
        # A grandchild too: the whole process group of the rank must go.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open("hung.pids", "w") as f:
            f.write(f"{os.getpid()} {child.pid} {tempfile.gettempdir()}")
        time.sleep(3600)
'''


def test_passing_suite(pytester: pytest.Pytester, rank_tmp, leftovers):
    pytester.makepyfile(test_user=PASSING)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    assert leftovers(rank_tmp) == []


def test_failing_rank_fails_with_its_traceback(pytester: pytest.Pytester, rank_tmp, leftovers):
    pytester.makepyfile(test_user=FAILING_RANK)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "rank 1 failed first: ValueError: rank 1 got a bad value: 41" in out
    # The rank's own traceback, down to the user's frame that raised.
    result.stdout.fnmatch_lines(["*---------- rank 1 (failed) ----------*", "*in check_input*",
                                 "*ValueError: rank 1 got a bad value: 41*"])
    assert leftovers(rank_tmp) == []


def test_hanging_rank_fails_at_the_timeout_naming_it(pytester: pytest.Pytester, rank_tmp, leftovers):
    # The marker's timeout covers the ranks' start-up (documented): 8 s for the test beside the start-up of two
    # ranks timed now. A fixed 8 s was spent starting both ranks on a loaded machine, and the report named both.
    timeout = round(8 + 2 * recent_startup_s())
    pytester.makepyfile(test_user=HANGING_RANK.replace("{timeout}", str(timeout)))
    start = time.monotonic()
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    elapsed = time.monotonic() - start
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*Rank 1 did not finish within the {timeout} s timeout (ranks that finished: 0)*"])
    # The timeout plus pytest's and the ranks' start-up (scaled to this machine's load), not an hour.
    assert elapsed < timeout + slack_s(measured_startup_s(), 4), elapsed
    rank_pid, grandchild_pid, tmp = (pytester.path / "hung.pids").read_text().split()
    assert tmp == str(rank_tmp)  # so the leftover scan below looks in the right place
    for pid in (int(rank_pid), int(grandchild_pid)):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert leftovers(rank_tmp) == []


def test_unpicklable_argument_is_a_clear_failure(pytester: pytest.Pytester, rank_tmp, leftovers):
    pytester.makepyfile(test_user='''
import threading
import pytest

@pytest.fixture
def lock():
    return threading.Lock()

@pytest.mark.distributed(world_size=2, timeout=30)
def test_needs_lock(lock):
    pass
''')
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cannot be sent to the rank processes*"])
