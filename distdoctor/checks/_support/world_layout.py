"""The world's layout as the launcher's variables describe it: ranks on this node, and whether it spans hosts."""

from __future__ import annotations

from distdoctor.core.context import CheckContext


def local_ranks(ctx: CheckContext, default: int | None = None) -> int | None:
    """Ranks on this node (LOCAL_WORLD_SIZE, else the scheduler's tasks on this node), else ``default``."""
    launch = ctx.launch
    for var in (launch.local_world_size, launch.scheduler_local_size):
        if var is not None and var.value is not None:
            return var.value
    return default


def multi_host(ctx: CheckContext) -> bool | None:
    """True when the world spans more than one host; None when the environment does not say.

    WORLD_SIZE > LOCAL_WORLD_SIZE counts as evidence of other hosts only when the sizes add up
    (WORLD_SIZE a multiple of LOCAL_WORLD_SIZE): WORLD_SIZE=3 with LOCAL_WORLD_SIZE=2 is a world
    whose size is wrong or whose third rank is missing, not a sign of a second host.
    """
    launch = ctx.launch
    if launch.scheduler_nodes and launch.scheduler_nodes.value:
        return launch.scheduler_nodes.value > 1
    size, local = launch.world_size.value, launch.local_world_size.value
    if size is not None and local is not None and local > 0:
        return size > local if size % local == 0 else None
    nnodes = ctx.env.get("PET_NNODES", "").strip()
    if nnodes.isascii() and nnodes.isdigit() and len(nnodes) <= 6:
        return int(nnodes) > 1
    return None
