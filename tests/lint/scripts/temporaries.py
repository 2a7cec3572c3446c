"""Collectives whose output is a temporary: the received value is lost."""
import torch
import torch.distributed as dist


def share(lr, loss, world, cfg):
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=30))
    dist.broadcast(torch.tensor(lr), src=0)  # expect: lint.E005
    dist.all_reduce(loss.clone())  # expect: lint.E005
    dist.all_gather([torch.zeros_like(loss) for _ in range(world)], loss)  # expect: lint.E005
    dist.broadcast_object_list([cfg], src=0)  # expect: lint.E005
    dist.all_reduce(torch.tensor([lr]).cuda())  # expect: lint.E005
    # A constant temporary is a synchronisation dummy, not a lost value.
    dist.all_reduce(torch.zeros(1))
    lr_t = torch.tensor(lr)
    dist.broadcast(lr_t, src=0)
    objects = [cfg]
    dist.broadcast_object_list(objects, src=0)
    if dist.get_rank() == 0:
        dist.broadcast_object_list([cfg], src=0)  # the source's side: sending a temporary is fine
    else:
        received = [None]
        dist.broadcast_object_list(received, src=0)
    return lr_t.item(), objects[0]
