"""torch.distributed used before the process group exists, directly and through a helper."""
import datetime

import torch.distributed as dist


def setup(backend):
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=5))


def main():
    rank = dist.get_rank()  # expect: lint.E013
    world = dist.get_world_size() if dist.is_initialized() else 1
    setup("nccl")
    return rank, world, dist.get_rank()
