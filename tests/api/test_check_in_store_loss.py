"""A rank whose store vanishes mid check-in (rank 0 raised and exited) reports that, no traceback."""

import time

import pytest

from distdoctor.embedded import bounded_init as gi


class VanishingStore:
    """Accepts the check-in, then behaves like a TCPStore whose server process has exited."""

    def add(self, key, amount):
        return 1

    def set(self, key, value):
        pass

    def check(self, keys):
        raise RuntimeError("Failed to recv, got 0 bytes. Connection was likely closed.")


def test_store_closed_before_the_verdict_is_a_finding():
    target = gi.Target("127.0.0.1", 29500, rank=1, world_size=2, agent_store=False)
    with pytest.raises(gi.CheckInFailed) as failed:
        gi.check_in(VanishingStore(), target, time.monotonic() + 5, env={})
    (finding,) = failed.value.findings
    assert finding.cause == "master_unreachable" and "closed before rank 1 read its verdict" in finding.title
