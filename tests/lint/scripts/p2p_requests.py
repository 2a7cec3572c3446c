"""Ring exchange with non-blocking sends: one request dropped, one kept but never waited."""
import torch
from torch.distributed import irecv, isend
import torch.distributed as dist


def exchange(tensor, rank, world):
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
    buffer = torch.zeros_like(tensor)
    isend(tensor, dst=(rank + 1) % world)  # expect: lint.E002
    request = irecv(buffer, src=(rank - 1) % world)  # expect: lint.W003
    ops = [dist.P2POp(dist.isend, tensor, (rank + 1) % world)]
    dist.batch_isend_irecv(ops)  # expect: lint.E002
    dist.all_reduce(tensor, async_op=True)  # expect: lint.E002
    return buffer


def exchange_right(tensor, rank, world):
    buffer = torch.zeros_like(tensor)
    send = dist.isend(tensor, dst=(rank + 1) % world)
    recv = dist.irecv(buffer, src=(rank - 1) % world)
    for request in (send, recv):
        request.wait()
    work = dist.all_reduce(tensor, async_op=True)
    work.wait()
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, 1)])
    pending = [r for r in requests]
    return buffer, pending
