"""A small DDP job on gloo that hangs on purpose, for `distdoctor stacks` tests: python train.py MODE READY_DIR."""

# MODE sleep: rank 1 sleeps at step 2 while the others wait in DDP's gradient all-reduce.
# MODE early_exit: the last rank exits with code 3 before init_process_group; the others wait
#   in the rendezvous (under gloo, a rank that exits after init closes its connections and its
#   peers fail at once, so a rank that died is seen with peers still waiting only before init).
# MODE recv: every rank receives from the next one and none sends: every rank waits in recv.
# MODE busy: no hang: every rank computes (matrix products before the model, then DDP's forward
#   and backward), about 0.3 s a step on an idle core, until it is ended.
# MODE pause: as busy, but rank 1 sleeps PAUSE_S seconds every PAUSE_EVERY steps, from step
#   PAUSE_STEP on (a slow checkpoint): a stall that forms and clears, again and again.

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

MODE, READY = sys.argv[1], sys.argv[2]
HANG_STEP = 2
BUSY_PRODUCTS = 120  # 256x256 matrix products a step in MODE busy
PAUSE_STEP, PAUSE_EVERY, PAUSE_S = 4, 30, 10.0


def ready(rank: int) -> None:
    # The test waits for every rank's file before it looks: each rank is at its hang point.
    with open(os.path.join(READY, f"rank{rank}"), "w") as fh:
        fh.write(str(os.getpid()))


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ready(rank) if MODE == "early_exit" else None
    if MODE == "early_exit" and rank == world - 1:
        os._exit(3)
    dist.init_process_group("gloo", timeout=timedelta(seconds=900))
    model = DDP(torch.nn.Linear(16, 4))
    weights = torch.randn(256, 256)
    for step in range(10**9 if MODE in ("busy", "pause") else 100):
        if MODE in ("busy", "pause"):
            for _ in range(BUSY_PRODUCTS):
                weights = torch.tanh(weights @ weights / 256)
        if step == HANG_STEP:
            ready(rank)
            if MODE == "sleep" and rank == 1:
                time.sleep(3600)
            if MODE == "recv":
                dist.recv(torch.zeros(1), src=(rank + 1) % world)
        if MODE == "pause" and step % PAUSE_EVERY == PAUSE_STEP and rank == 1:
            time.sleep(PAUSE_S)
        loss = model(torch.randn(8, 16)).sum()
        loss.backward()


if __name__ == "__main__":
    main()
