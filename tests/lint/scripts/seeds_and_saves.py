"""A seed that differs per rank with no parameter sync; checkpoints written by every rank."""
import datetime

import torch
import torch.distributed as dist


def save(model, path):
    torch.save(model.state_dict(), path)


def main(make_model, path):
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
    rank = dist.get_rank()
    torch.manual_seed(42 + rank)  # expect: lint.W016
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # expect: lint.W010
    model(torch.ones(1)).sum().backward()
    optimizer.step()
    torch.save(model.state_dict(), path)  # expect: lint.W017
    if rank == 0:
        save(model, path)
    torch.save(model.state_dict(), f"{path}.rank{rank}")
    save_everywhere(model, path)
    return model


def save_everywhere(model, path):
    torch.save(model.state_dict(), path)  # expect: lint.W017
