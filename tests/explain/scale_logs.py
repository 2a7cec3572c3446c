"""Per-rank logs of a large job, made from a real failing job's logs (renumbered): explain at scale.

The source is tests/explain/fixtures/per_rank_sigkill/ (a real 3-rank gloo job, rank 2 SIGKILLed at
step 10: its log stops without a word, the others' all_reduce fails with "Connection reset by
peer"). write_job(dir, world) writes rank<K>.log for K < world: the killed rank's log as rank
`killed`, every other rank's a copy of rank 0's (or rank 1's) with its rank and the world size
renumbered, so a 1,024-rank job reads as that job would have at that size.
"""

from __future__ import annotations

import re
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "fixtures" / "per_rank_sigkill"
_RANK = re.compile(r"\[rank\d+\]")


# A rank's own exception as torch 2.13 printed it for rank 1 of tests/explain/jobs/wrapped_job.py's
# accelerate job (tests/explain/test_wrapped_jobs.py), its paths shortened.
RAISED = """[rank1]: Traceback (most recent call last):
[rank1]:   File "/tmp/job/train.py", line 117, in <module>
[rank1]:     main()
[rank1]:   File "/tmp/job/train.py", line 70, in main
[rank1]:     raise ValueError(f"corrupt sample in shard {accelerator.process_index}")
[rank1]: ValueError: corrupt sample in shard 1
"""


def renumbered(text: str, rank: int, world: int) -> str:
    return _RANK.sub(f"[rank{rank}]", text).replace("world size 3", f"world size {world}")


def write_job(directory: Path, world: int, killed: int, raised: bool = False) -> list[Path]:
    """rank<K>.log for K < world; with raised, the rank `killed` raised its own ValueError instead of
    dying silently (its steps, then its traceback)."""
    directory.mkdir(parents=True, exist_ok=True)
    waiting = [(SOURCE / "rank0.log").read_text(), (SOURCE / "rank1.log").read_text()]
    silent = (SOURCE / "rank2.log").read_text() + (RAISED if raised else "")
    paths = []
    for rank in range(world):
        text = silent if rank == killed else waiting[rank % 2]
        path = directory / f"rank{rank}.log"
        path.write_text(renumbered(text, rank, world))
        paths.append(path)
    return paths
