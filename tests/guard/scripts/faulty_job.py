"""A plain torch.distributed script with one fault, chosen by argv[1]; it knows nothing of distdoctor."""

import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
fault = sys.argv[1]
t = torch.ones(4)
dist.all_reduce(t)

if fault == "shape":
    x = torch.randn(2, 3) if rank == 0 else torch.randn(3, 2)
    dist.broadcast(x, src=0)  # LINE:shape
elif fault == "dtype":
    x = torch.zeros(4, dtype=torch.float32 if rank == 0 else torch.float64)
    dist.broadcast(x, src=0)  # LINE:dtype
elif fault == "order":
    if rank == 0:
        dist.broadcast(t, src=0)  # LINE:order0
    else:
        dist.all_reduce(t)  # LINE:order1
elif fault == "straggler":
    if rank == 1:
        time.sleep(120)  # LINE:sleep
    dist.all_reduce(t)  # LINE:wait
elif fault == "dropped":
    if rank == 0:
        dist.isend(t, dst=1)  # LINE:dropped
    else:
        dist.recv(t, src=0)
    dist.barrier()
elif fault == "uneven":
    for batch in range(5 if rank == 0 else 3):  # rank 1 got fewer batches and leaves the loop
        dist.all_reduce(t)  # LINE:loop
    dist.destroy_process_group()
    sys.exit(0)
print(f"rank {rank} done", flush=True)
dist.barrier()
dist.destroy_process_group()
