"""A DDP job on gloo with one fault chosen by argv, for the compatibility matrix; it knows nothing of distdoctor.

python train.py MODE [READY_DIR]: MODE healthy (6 steps, then exit 0), straggler (rank 1 sleeps
before step 3 while rank 0 waits in DDP's gradient all-reduce), raise (rank 1 raises before
step 3) or kill (rank 1 is killed by SIGKILL before step 3, as the OOM killer does). With READY_DIR each rank writes rank<R> there when it reaches step 3: the ranks are at
their fault (`distdoctor stacks` looks then). Only what torch 2.1 already has is used.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

mode = sys.argv[1]
ready_dir = sys.argv[2] if len(sys.argv) > 2 else ""
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(6):
    if step == 3 and ready_dir:
        with open(os.path.join(ready_dir, f"rank{rank}"), "w") as fh:
            fh.write(str(os.getpid()))
    if step == 3 and rank == 1 and mode == "straggler":
        time.sleep(300)  # LINE:sleep
    if step == 3 and rank == 1 and mode == "raise":
        raise ValueError(f"bad batch at step {step}")  # LINE:raise
    if step == 3 and rank == 1 and mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # LINE:kill
    optimizer.zero_grad()
    model(torch.randn(8, 16)).sum().backward()  # LINE:backward
    optimizer.step()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
