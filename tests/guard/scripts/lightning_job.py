"""A Lightning job (Trainer(strategy="ddp"), 2 CPU processes, gloo): rank 1 has one slow batch of argv[1] seconds."""

import sys
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SLOW_S = float(sys.argv[1])


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(10, 1)

    def training_step(self, batch, index):
        if self.global_rank == 1 and index == 3:
            time.sleep(SLOW_S)  # LINE:slow
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 10), torch.randn(96, 1))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), DataLoader(data, batch_size=8))
    print(f"rank {trainer.global_rank} done", flush=True)
