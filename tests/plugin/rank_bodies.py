"""Test bodies run in rank processes by tests/plugin/test_testing.py."""

import os
import time
from pathlib import Path

import torch.distributed as dist


def rank_one_dies():
    if dist.get_rank() == 1:
        os._exit(3)  # no result, no traceback: a crash
    dist.barrier()


def last_to_finish_sees_every_peer_alive():
    # A rank that had finished used to exit at once, closing its gloo pairs under a peer that was
    # still connecting (rank 0 of 3 failed with "Connection closed by peer" at load 4).
    store = dist.distributed_c10d._get_default_store()
    store.set(f"pid/{dist.get_rank()}", str(os.getpid()))
    if dist.get_rank() != 0:
        return
    time.sleep(1.5)  # the peers are done and would be gone by now
    for peer in range(1, dist.get_world_size()):
        pid = int(store.get(f"pid/{peer}"))
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(f"/proc/{pid}").exists() else "gone"
        assert state not in ("gone", "Z", "X"), f"rank {peer} (PID {pid}) left before rank 0 finished: {state}"


def sees_launcher_env():
    assert os.environ["RANK"] == str(dist.get_rank())
    assert os.environ["WORLD_SIZE"] == "3" == str(dist.get_world_size())
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"


def runs_intra_op_threads(expected: int):
    import torch

    assert torch.get_num_threads() == expected, (os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads())
