"""Written for these tests in the style of pytorch/examples' FSDP/T5_training.py."""
import datetime
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.utils.data.distributed import DistributedSampler


def setup():
    dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=10))


def fsdp_main(args, model, train_dataset, val_dataset, train):
    local_rank = int(os.environ["LOCAL_RANK"])
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    sampler1 = DistributedSampler(train_dataset, rank=rank, num_replicas=world_size, shuffle=True)
    sampler2 = DistributedSampler(val_dataset, rank=rank, num_replicas=world_size)
    setup()
    torch.cuda.set_device(local_rank)
    model = FSDP(model, device_id=torch.cuda.current_device())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        train(args, model, rank, world_size, sampler1, optimizer, epoch, sampler=sampler1)
    dist.barrier()
    states = model.state_dict()
    if rank == 0:
        torch.save(states, "t5.pt")
    dist.destroy_process_group()
    return sampler2
