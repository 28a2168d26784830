"""A Lightning script that leaves out `ddpjob.trainer_kwargs()` (devices=1): under torchrun each process would
train alone. tests/trainer/test_framework_world_size_check.py runs it under torchrun."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from ddp_trainer.runtime import lightning as ddpjob


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(16, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    data = TensorDataset(torch.randn(64, 16), torch.randint(0, 2, (64,)))
    trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, callbacks=[ddpjob.DDPJobCallback()],
                        enable_checkpointing=False, logger=False, enable_progress_bar=False)
    trainer.fit(Classifier(), DataLoader(data, batch_size=8), ckpt_path=ddpjob.resume_from_checkpoint())
    ddpjob.exit_process(0)
