"""A DDP job whose loop runs at module level, as short scripts and tutorials do: python module_level.py MODE READY_DIR."""

# py-spy shows no variables of a module-level frame, so the DistributedDataParallel model is not
# seen among them; the script's own source is what says the model is DDP.
# MODE sleep: rank 1 sleeps at step 2 while rank 0 waits in DDP's gradient all-reduce.
# MODE busy: every rank computes (matrix products, then DDP's backward) until it is ended.
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

MODE, READY = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", timeout=timedelta(seconds=900))
rank = dist.get_rank()
model = DistributedDataParallel(torch.nn.Linear(16, 4))
weights = torch.randn(256, 256)
for step in range(10**9):
    if MODE == "busy":
        for _ in range(120):
            weights = torch.tanh(weights @ weights / 256)
    if step == 2:
        with open(os.path.join(READY, f"rank{rank}"), "w") as fh:
            fh.write(str(os.getpid()))
        if MODE == "sleep" and rank == 1:
            time.sleep(3600)  # LINE:sleep
    model(torch.randn(8, 16)).sum().backward()  # LINE:backward
