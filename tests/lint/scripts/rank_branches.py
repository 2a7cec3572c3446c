"""Collectives under rank checks: one-sided ones deadlock; matched and zero-first ones do not."""
import contextlib

import torch
import torch.distributed as dist
from torch.distributed import broadcast as bcast


def sync_config(config, args):
    dist.init_process_group("nccl", timeout=__import__("datetime").timedelta(minutes=5))
    rank = dist.get_rank()
    if rank == 0:
        bcast(config, src=0)  # expect: lint.E004
    if args.local_rank in [-1, 0]:
        dist.barrier()  # expect: lint.E004
    if dist.get_rank() == 0:
        evaluate(config)  # expect: lint.E004
    if args.rank != -1:
        dist.reduce(config, dst=0)  # same on every rank: no finding


def evaluate(metrics):
    dist.all_reduce(metrics)


def gather_to_zero(tensor, world):
    if dist.get_rank() == 0:
        out = [torch.zeros_like(tensor) for _ in range(world)]
        dist.gather(tensor, gather_list=out, dst=0)
        return out
    else:
        dist.gather(tensor, dst=0)
        return None


def elif_chain(t, role, members):
    if role == "leader":
        dist.broadcast(t, src=0)
    elif dist.get_rank() in members:
        dist.broadcast(t, src=0)


def subgroup_only(t, group, group_ranks):
    if dist.get_rank() in group_ranks:
        dist.all_reduce(t, group=group)


def early_exit(t, members):
    if dist.get_rank() not in members:
        dist.barrier()
        return
    dist.all_reduce(t)
    dist.barrier()


def new_group_on_some_ranks(rank):
    if rank == 0:
        return dist.new_group([0, 1])  # expect: lint.E004
    return None


@contextlib.contextmanager
def zero_first(local_rank):
    if local_rank not in (-1, 0):
        dist.barrier()
    yield
    if local_rank == 0:
        dist.barrier()
