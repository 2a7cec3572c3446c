"""One rank's run: its timing constants, its outcome, and what rank 0 knows so far."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from distdoctor.core.report import Report, format_ranks
from distdoctor.world.store_exchange import CheckIns


# The promise is a report within the deadline + 1 s. Rank 0's watchdog fires this long before
# the deadline, so that its store reads (each bounded by STORE_READ_S) and the rendering of the
# partial report are done by the deadline (measured: ~0.1 s for a 2-rank partial report).
ROOT_MARGIN_S = 0.4
STORE_READ_S = 0.25
# Rank 0's watchdog exits the process at the latest this long after it fired.
ROOT_EXPIRE_GRACE_S = 0.9
# Non-root ranks keep their watchdog this much longer than the deadline, so that rank 0 (which
# knows the most) is the one that reports when a deadline passes; they wait for rank 0's word
# until MEMBER_WAIT_S past the deadline, and exit at the latest MEMBER_EXPIRE_GRACE_S after their
# watchdog fired: all of it inside the deadline + 1 s.
NON_ROOT_GRACE_S = 0.4
MEMBER_WAIT_S = 0.2
MEMBER_EXPIRE_GRACE_S = 0.5
# After the last expected rank checked in, rank 0 listens this much longer so that a second
# process claiming a rank at nearly the same moment is still caught before the collectives.
SETTLE_S = 0.05
# How long rank 0 waits for the others' goodbyes before releasing a store it hosts (after a
# normal end, and after its watchdog fired: members poll every 0.1 s at most).
GOODBYE_S = 1.0
GOODBYE_ON_EXPIRE_S = 0.3
# How long an interrupted rank other than 0 waits for rank 0's final word (the same signal usually
# reaches rank 0, which renders its partial report and then gives it) before reporting itself.
INTERRUPT_FINAL_WAIT_S = 1.0
# How long a flow that lost the race to report waits for the winner's report to be written.
EMIT_WAIT_S = 3.0

def working_reserve(timeout: float) -> float:
    """Time kept back from the run's deadline for gathering and rendering the report."""
    return min(max(0.1 * timeout, 0.5), 2.0)


@dataclass
class RankOutcome:
    report: Report | None
    exit_code: int
    # True when this process rendered a report (rank 0, --all-ranks, or a rank on its own).
    reported: bool = False
    world_opened: bool = False
    # The environment described a world, so torch.distributed was loaded (and maybe a store
    # client that failed): the CLI ends such a process with os._exit once the report is out,
    # since torch's interpreter teardown alone takes 0.4-1.2 s on a busy node.
    world_described: bool = False


@dataclass
class RunProgress:
    """What rank 0 knows so far; the watchdog builds the partial report from it."""

    stage: str = "local"
    expected: list[int] = field(default_factory=list)
    checkins: CheckIns | None = None
    remote: dict[int, dict[str, Any]] = field(default_factory=dict)


def ranks_text(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + format_ranks(ranks)
