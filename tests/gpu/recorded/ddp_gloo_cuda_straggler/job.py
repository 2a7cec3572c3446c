
import time, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
print("ready", flush=True)
for step in range(1000):
    if rank == 1 and step == 3:
        time.sleep(60)
    loss = model(torch.randn(256, 1024, device="cuda")).square().mean()
    loss.backward()
    opt.step(); opt.zero_grad()
    print("step", step, loss.item(), flush=True)
