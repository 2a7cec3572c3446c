"""Test-only check: one rank blocks inside a collective that no deadline interrupts.

Loaded with --checks-dir by tests/multiproc; inert unless DISTDOCTOR_TEST_HANG_RANK names a rank.
Every rank joins a second gloo group whose timeout is an hour; the named rank then waits in a
recv (a C++ wait) for a message nobody sends, as a rank stuck in a real collective would.
"""

import os
from datetime import timedelta

from distdoctor import SkipCheck, check


@check(stage="collective", tags=("testing",), timeout=3600)
def hang_in_collective(ctx):
    hang_rank = os.environ.get("DISTDOCTOR_TEST_HANG_RANK")
    world = ctx.world
    if hang_rank is None or world is None or world.process_groups.get("gloo") is None:
        raise SkipCheck("not asked to hang")
    import torch
    import torch.distributed as dist

    group = dist.new_group(backend="gloo", timeout=timedelta(hours=1))
    if world.rank == int(hang_rank):
        peer = (world.rank + 1) % world.size
        dist.recv(torch.zeros(1), src=peer, group=group)
    return []
