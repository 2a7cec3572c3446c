"""Training-script patterns a week-long job has, each chosen by argv[1]; it knows nothing of distdoctor.

pauses     the DDP tutorial's loop: rank 0 writes a checkpoint alone (as the tutorial's rank-0-only
           snapshot does) while rank 1 waits in DDP's all-reduce; later rank 1 has one slow batch
healthy    the same loop with short pauses (shorter than the hang timeout)
usertimeout  rank 1's own storage read raises TimeoutError('Read timed out.')
deadthread rank 1's prefetch thread dies; its main thread then waits for a batch that never comes
           (an uneven all_to_all_single first: every mixture-of-experts step does one)
recvcycle  both ranks receive from each other first
"""

import queue
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

mode = sys.argv[1]
pause_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0  # recvcycle: unused
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)


def save_snapshot(model):
    time.sleep(pause_s)  # LINE:checkpoint


def read_shard(step):
    raise TimeoutError("Read timed out.")  # LINE:usertimeout


def prefetch(batches):
    raise ConnectionError("storage node went away")  # LINE:thread


if mode == "recvcycle":
    t = torch.zeros(4)
    if len(sys.argv) > 3:  # a folder: say "entering recv" with this process's pid (the stacks test)
        with open(f"{sys.argv[3]}/rank{rank}", "w") as f:
            f.write(str(__import__("os").getpid()))
    dist.recv(t, src=1 - rank)  # LINE:recv
    dist.send(t, dst=1 - rank)
    sys.exit(0)

if mode == "deadthread":
    # Each rank sends rank r (r + 1) rows of its own: legal unevenness, not a mismatch.
    inp = torch.ones(sum(r + 1 for r in range(world)) * (rank + 1))
    out = torch.zeros((rank + 1) * sum(r + 1 for r in range(world)))
    dist.all_to_all_single(out, inp, [(rank + 1) * (r + 1) for r in range(world)], [(r + 1) * (rank + 1) for r in range(world)])

model = DDP(nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)))
loss_fn, optimizer = nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.001)
batches = queue.Queue()
for step in range(8):
    if mode in ("pauses", "healthy") and rank == 0 and step == 2:
        save_snapshot(model)  # LINE:save
    if mode in ("pauses", "healthy") and rank == 1 and step == 5:
        time.sleep(pause_s)  # LINE:slowbatch
    if mode == "usertimeout" and rank == 1 and step == 3:
        read_shard(step)
    if mode == "deadthread" and rank == 1 and step == 3:
        worker = threading.Thread(target=prefetch, args=(batches,), name="prefetch")
        worker.start()
        worker.join()
        batches.get(timeout=120)  # LINE:batchwait
    optimizer.zero_grad()
    loss = loss_fn(model(torch.randn(20, 10)), torch.randn(20, 5))
    loss.backward()  # LINE:backward
    optimizer.step()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
