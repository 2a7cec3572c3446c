"""DataParallel inside a torchrun script, and a model trained on many ranks but never wrapped."""
import torch
import torch.distributed as dist
import torch.nn as nn


def train(model, data):
    dist.init_process_group("nccl", timeout=__import__("datetime").timedelta(minutes=5))
    model = nn.DataParallel(model)  # expect: lint.E009
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # expect: lint.W010
    for x, y in data:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
