"""Shape, dtype, device and value agreement through a pre-flight broadcast of tensor specs.

Rank 0 publishes its spec table (distdoctor.checks._support.tensor_specs: name, shape, dtype, device type and a
value fingerprint per tensor, as JSON) through the world's store; every other rank fetches it
and compares its own table against it, so each rank learns by itself whether it disagrees, and
names itself in the findings (rank 0 merges them into one report). Cost per rank: one table
out (rank 0) or one table in; rank 0 sends O(1) messages, whatever the world size.

``preflight()`` compares a user's model with the same spec tables and the same
``tensorspec.compare_tables``, over its own exchange inside the live process group (one digest
all_gather; see distdoctor/embedded/preflight.py); the built-in check here uses tensors every rank builds the same way (a seeded nn.Linear, a seeded randn, a tensor
of the default dtype), which catches ranks whose torch produces different values for the same
seed or runs with another default dtype.
"""

from __future__ import annotations

from typing import Any

from distdoctor.core.context import CheckContext
from distdoctor.core.findings import Finding
from distdoctor.core.registry import SkipCheck, check, finding_kind
from distdoctor.checks._support.tensor_specs import (
    SPEC_DEVICE,
    SPEC_DTYPE,
    SPEC_NOT_COMPARED,
    SPEC_PRESENCE,
    SPEC_SHAPE,
    SPEC_VALUES,
    SpecTable,
    compare_tables,
    spec_table,
)
from distdoctor.core.context import WorldError

SPECS_MISSING = finding_kind(
    "agree.E001",
    cause="collective_timeout_hang",
    title="Rank 0's tensor specs did not arrive before the deadline",
    hint="Rank 0 did not reach this step: look at rank 0's output for what it is stuck on",
)
SPECS_UNREADABLE = finding_kind(
    "agree.W002",
    cause="unknown",
    title="Rank 0's tensor specs could not be read",
    hint="Run the same distdoctor version on every rank; very large models may exceed the spec size bound",
)

# A spec row is ~60-100 bytes: 16 MiB holds ~200k tensors, far beyond any model's parameter count.
SPEC_LIMIT_BYTES = 16 * 2**20
PROBE_SEED = 20240607


def spec_key(tag: str) -> str:
    return f"specs/{tag}/0"


def agreement_findings(world: Any, table: SpecTable, *, tag: str, deadline: float, label: str = "tensor", check: str = "") -> list[Finding]:
    """Publish (rank 0) or fetch and compare (other ranks) a spec table; findings name this rank.

    Every rank must call it with the same ``tag``; ``deadline`` is on ``world.clock``.
    """
    if world.rank == 0:
        world.put(spec_key(tag), table.encode(), limit=SPEC_LIMIT_BYTES)
        return []
    try:
        raw = world.fetch(spec_key(tag), deadline, limit=SPEC_LIMIT_BYTES)
    except WorldError as exc:
        return [SPECS_UNREADABLE(detail=str(exc), check=check, data={"tag": tag})]
    if raw is None:
        return [SPECS_MISSING(
            detail=f"This rank waited for rank 0's specs of {tag!r} until its deadline.",
            check=check,
            data={"tag": tag},
        )]
    try:
        reference = SpecTable.decode(raw)
    except (ValueError, TypeError) as exc:
        return [SPECS_UNREADABLE(detail=str(exc), check=check, data={"tag": tag})]
    return compare_tables({0: reference, world.rank: table}, reference=0, label=label, check=check)


def probe_tensors() -> list[tuple[str, Any]]:
    """Tensors every rank builds identically: the same seed, the same layers, default dtype."""
    import torch  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(PROBE_SEED)
        layer = torch.nn.Linear(8, 4)
        noise = torch.randn(16)
    return [
        ("probe.linear.weight", layer.weight),
        ("probe.linear.bias", layer.bias),
        ("probe.randn", noise),
        ("probe.default_dtype", torch.zeros(4)),
    ]


@check(
    stage="collective",
    tags=("collective", "agreement"),
    emits=(SPEC_SHAPE, SPEC_DTYPE, SPEC_DEVICE, SPEC_VALUES, SPEC_PRESENCE, SPEC_NOT_COMPARED, SPECS_MISSING, SPECS_UNREADABLE),
)
def seeded_tensors_agree(ctx: CheckContext):
    """Tensors built the same way (seeded init, default dtype) have equal specs and values on every rank."""
    world = ctx.world
    if world is None or not hasattr(world, "fetch"):
        raise SkipCheck("no cross-rank world")
    deadline = world.clock() + ctx.config.check_timeout * 0.8
    return agreement_findings(
        world, spec_table(probe_tensors()), tag="probe", deadline=deadline, check="agreement.seeded_tensors_agree"
    )
