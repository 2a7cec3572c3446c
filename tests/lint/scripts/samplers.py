"""DistributedSampler with literal arguments, a sampler never told the epoch, an unsharded loader."""
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler as DS


def main(model, train_set, val_set, epochs):
    dist.init_process_group("nccl", timeout=__import__("datetime").timedelta(minutes=5))
    model = DistributedDataParallel(model)
    fixed = DS(train_set, num_replicas=4, rank=0)  # expect: lint.E006, lint.W007
    sampler = DS(train_set)  # expect: lint.W007
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=32, sampler=DS(val_set, shuffle=False))
    extra = DataLoader(train_set, batch_size=32, shuffle=True)  # expect: lint.W008
    for epoch in range(epochs):
        for batch in loader:
            step(batch)
    return fixed, val_loader, extra


def step(batch):
    return batch
