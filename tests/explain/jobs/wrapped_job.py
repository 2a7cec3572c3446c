"""Failing jobs under launchers that wrap a rank's exception (MODE): mp.spawn, Lightning, accelerate,
and torchelastic restarts. Each prints what its launcher prints; explain must read through it."""

import os
import re
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

BAD_LINE_RANK = 1


def spawn_missing(rank: int, world_size: int, port: str) -> None:
    """world_size=3 but mp.spawn starts two processes: the store waits for a rank that never comes."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=8))


def spawn_raise(rank: int, world_size: int, port: str) -> None:
    """Rank 1 raises its own error at step 2; rank 0 then loses its peer."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=20))
    for step in range(4):
        if step == 2 and rank == BAD_LINE_RANK:
            raise ValueError(f"corrupt sample in shard {rank}")
        dist.all_reduce(torch.ones(2))
        print(f"rank {rank} step {step}", flush=True)


def run_spawn(target) -> None:
    import torch.multiprocessing as mp

    world = 3 if target is spawn_missing else 2
    mp.spawn(target, args=(world, os.environ.get("PORT", "29533")), nprocs=2)


def lightning_raise() -> None:
    """Lightning's Trainer(strategy="ddp") on CPU with two processes; rank 1 raises in training_step."""
    import lightning as L

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            if batch_idx == 2 and self.global_rank == BAD_LINE_RANK:
                raise ValueError(f"corrupt sample in shard {self.global_rank}")
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 4)), batch_size=4)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), data)


def accelerate_raise() -> None:
    """accelerate launch --cpu --num_processes 2; rank 1 raises in its loop."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(4, 1))
    for step in range(4):
        if step == 2 and accelerator.process_index == BAD_LINE_RANK:
            raise ValueError(f"corrupt sample in shard {accelerator.process_index}")
        loss = model(torch.randn(4, 4)).pow(2).mean()
        accelerator.backward(loss)
        print(f"rank {accelerator.process_index} step {step}", flush=True)


def elastic_restart() -> None:
    """Under torchrun --max-restarts 1: attempt 0's rank 1 raises RuntimeError; in the restart rank 1
    publishes a Gloo address nothing listens on, so rank 0's init_process_group fails in Gloo's
    connectFullMesh (connection refused). With RECOVER set, the restart runs to its end."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = int(os.environ["RANK"])
    if attempt == 0:
        dist.init_process_group("gloo", timeout=timedelta(seconds=30))
        for step in range(4):
            if step == 2 and rank == BAD_LINE_RANK:
                raise RuntimeError(f"loss became NaN at step {step} on rank {rank}")
            dist.all_reduce(torch.ones(2))
            print(f"rank {rank} step {step}", flush=True)
        return
    # torch 2.13's env:// rendezvous uses the agent's store without an attempt prefix: a restart reads
    # attempt 0's Gloo addresses (refused, or a port another process reused: a hang). A fresh prefix per
    # attempt keeps the job deterministic; the ranks' addresses are then made ones nothing listens on.
    from torch.distributed.rendezvous import _create_c10d_store

    inner = _create_c10d_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank, 2,
                               timedelta(seconds=30))
    store = dist.PrefixStore(f"/attempt_{attempt}", inner)
    if not os.environ.get("RECOVER"):
        store = RefusingStore(store)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=20))
    for step in range(3):
        dist.all_reduce(torch.ones(2))
        print(f"rank {rank} attempt {attempt} step {step} loss 0.{step}", flush=True)
    dist.destroy_process_group()


def closed_port() -> bytes:
    """A loopback port nothing listens on (bound, then closed), big-endian as a sockaddr holds it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1].to_bytes(2, "big")


class RefusingStore(dist.Store):
    """A store that rewrites the loopback address Gloo publishes through it (a sockaddr_in: family 2,
    port, 127.0.0.1) to a port nothing listens on. Every rank publishes through one, so whichever side
    of a pair Gloo has dial the other, its connect is refused."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner = inner

    def set(self, key, value):
        data = bytes(value)
        if "/cpu/" in key:
            port = closed_port()
            data = re.sub(rb"\x02\x00..\x7f\x00\x00\x01", lambda m: b"\x02\x00" + port + b"\x7f\x00\x00\x01", data,
                          flags=re.S)
        self.inner.set(key, data)

    def get(self, key):
        return self.inner.get(key)

    def add(self, key, value):
        return self.inner.add(key, value)

    def compare_set(self, key, expected, desired):
        return self.inner.compare_set(key, expected, desired)

    def wait(self, keys, timeout=None):
        return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def check(self, keys):
        return self.inner.check(keys)

    def delete_key(self, key):
        return self.inner.delete_key(key)

    def num_keys(self):
        return self.inner.num_keys()

    def set_timeout(self, timeout):
        return self.inner.set_timeout(timeout)


if __name__ == "__main__":
    mode = os.environ.get("MODE") or sys.argv[1]
    if mode == "spawn_missing":
        run_spawn(spawn_missing)
    elif mode == "spawn_raise":
        run_spawn(spawn_raise)
    else:
        {"lightning_raise": lightning_raise, "accelerate_raise": accelerate_raise,
         "elastic_restart": elastic_restart}[mode]()
