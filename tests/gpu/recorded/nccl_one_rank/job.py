
import time, torch, torch.distributed as dist
dist.init_process_group("nccl", rank=0, world_size=1)
torch.cuda.set_device(0)
x = torch.randn(8192, 8192, device="cuda")
print("ready", flush=True)
end = time.time() + 40
while time.time() < end:
    y = x
    for _ in range(20):
        y = (y @ x).clamp_(-1, 1)
    dist.all_reduce(y)
    print("loss", y.sum().item(), flush=True)
dist.destroy_process_group()
