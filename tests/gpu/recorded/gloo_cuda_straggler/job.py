
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t)
print("ready", flush=True)
if rank == 1:
    time.sleep(60)
dist.all_reduce(t)
print("done", t[0].item(), flush=True)
