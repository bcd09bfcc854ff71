"""Train a tiny U-ViT for a few steps; run alone or under torchrun (see test_train.py)."""

import sys

import torch

from scalelong_edu.diffusion import linear_schedule
from scalelong_edu.models import build_model
from scalelong_edu.train import TrainConfig, Trainer

torch.manual_seed(0)
images = torch.rand(64, 1, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1
model = build_model("uvit-ci", 1, 16, "ls")
trainer = Trainer(model, images, linear_schedule(), TrainConfig(steps=6, batch_size=16, warmup=2, lr=1e-3),
                  device="cpu", progress=False)
trainer.fit()
if trainer.rank == 0:
    torch.save({"world": trainer.world, "losses": [h["loss"] for h in trainer.history],
                "model": trainer.model.state_dict()}, sys.argv[1])
