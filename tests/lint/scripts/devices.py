"""Devices from the global rank (breaks on the second node) and hard-coded GPU ids."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def setup():
    dist.init_process_group("nccl", timeout=__import__("datetime").timedelta(minutes=5))
    rank = dist.get_rank()
    torch.cuda.set_device(rank)  # expect: lint.W011
    return rank


def build(model, rank):
    model = model.to(rank)  # expect: lint.W011
    return DDP(model, device_ids=[rank])  # expect: lint.W011


def main(model):
    global_rank = int(os.environ["RANK"])
    device = torch.device(f"cuda:{global_rank}")  # expect: lint.W011
    rank = setup()
    ddp = build(model, rank)
    torch.cuda.set_device(0)  # expect: lint.W012
    state = torch.load("init.pt", map_location="cuda:0")  # expect: lint.W012
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return ddp, device, state
