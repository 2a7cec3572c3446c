"""docs/examples/train_preflight.py without distdoctor in the process: the reproducer of torch's
teardown abort ("terminate called without an active exception", exit -6), run by teardown_abort.py."""
import sys

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

torch.distributed.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
loader = DataLoader(data, sampler=DistributedSampler(data), batch_size=32)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
if "--no-barrier" not in sys.argv:
    torch.distributed.barrier()
torch.distributed.destroy_process_group()
