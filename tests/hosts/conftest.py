"""Fixtures for real multi-host scenarios: "hosts" made of network namespaces.

``lab`` gives two hosts (hosta 10.231.0.1, hostb 10.231.0.2) on one bridge; ``make_lab`` makes
labs of other shapes. Whatever a test does — fails, errors, is interrupted — the lab is removed
(fixture finalizer; atexit and SIGTERM/SIGHUP handlers as a second line), and a run starts by
removing what a crashed earlier run of these tests left (``ddtest-<dead pid>-*`` only).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import netns  # noqa: E402
from host_worlds import DISTDOCTOR_RESULTS, PLAIN_TORCH_RESULTS  # noqa: E402


@pytest.fixture(scope="session")
def netns_ready():
    """Skip (with the reason) where namespaces cannot be made; clean stale leftovers once."""
    reason = netns.why_unavailable()
    if reason:
        pytest.skip(reason)
    netns.install_exit_handlers()
    netns.cleanup_stale()
    yield
    netns.close_all()
    # Whatever tests were selected, the session ends with nothing of ours left behind (the
    # same check as test_zz_nothing_left_behind, which reports it as a test of its own).
    left = netns.leftovers()
    assert not any(left.values()), f"the hosts tests left these behind: {left}"


@pytest.fixture
def make_lab(netns_ready):
    labs: list[netns.Lab] = []

    def make(host_names=("hosta", "hostb"), ifnames=None) -> netns.Lab:
        lab = netns.Lab(tuple(host_names), ifnames=dict(ifnames or {}))
        labs.append(lab)
        return lab

    yield make
    for lab in labs:
        lab.close()


@pytest.fixture
def lab(make_lab) -> netns.Lab:
    return make_lab()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """What plain torch did in each scenario (users' experience today), next to the results."""
    if DISTDOCTOR_RESULTS:
        terminalreporter.section("distdoctor in the multi-host scenarios")
        for test, deadline, slowest, codes in DISTDOCTOR_RESULTS:
            took = f"{slowest:.2f}s" if slowest is not None else "killed at the bound"
            terminalreporter.write_line(f"{test}: --timeout {deadline:g}, slowest rank {took}, exit codes {codes}")
    if not PLAIN_TORCH_RESULTS:
        return
    terminalreporter.section("plain torch in the same scenarios (torch defaults, bounded wait)")
    for outcome in PLAIN_TORCH_RESULTS:
        terminalreporter.write_line(f"{outcome.scenario}: {outcome.summary()}")
