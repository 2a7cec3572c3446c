"""Test bodies run in rank processes by tests/plugin/test_testing.py."""

import os

import torch.distributed as dist


def rank_one_dies():
    if dist.get_rank() == 1:
        os._exit(3)  # no result, no traceback: a crash
    dist.barrier()


def sees_launcher_env():
    assert os.environ["RANK"] == str(dist.get_rank())
    assert os.environ["WORLD_SIZE"] == "3" == str(dist.get_world_size())
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"
