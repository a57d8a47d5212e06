"""LightningModules that use manual optimization, written as Lightning's documentation writes them.

``GAN`` follows Lightning's GAN tutorial (two optimizers; ``toggle_optimizer``, ``manual_backward``,
``opt.step()``, ``opt.zero_grad()``, ``untoggle_optimizer``), on 8x8 digits. Its latent noise comes with the batch
(``imgs, z = batch``) rather than from ``torch.randn`` in the step, so that a fused group and each trial trained
alone draw the same noise: random numbers drawn in a step come from one stream that the trials of a group share,
as dropout masks do, so a trial's draws are not those of its run alone.

``ManualMLP`` follows the manual-optimization page: ``opt = self.optimizers()``, ``self.manual_backward(loss)``,
``self.clip_gradients(opt, gradient_clip_val=..., gradient_clip_algorithm="norm")``, gradient accumulation over N
batches, and its learning-rate scheduler stepped by the step itself (``sch = self.lr_schedulers(); sch.step()``).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_hydro.demos.digits import load_digits_tensors

LATENT = 8


class NoisyDigits(L.LightningDataModule):
    """Digits scaled to [-1, 1], each image paired with a fixed latent vector; batches in a fixed order."""

    def __init__(self, batch_size: int = 64) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str | None = None) -> None:
        train, val = load_digits_tensors()
        noise = torch.randn(len(train), LATENT, generator=torch.Generator().manual_seed(0))
        self.train_set = TensorDataset(train.tensors[0] * 2 - 1, noise)
        self.val_set = TensorDataset(val.tensors[0] * 2 - 1, val.tensors[1])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)


class GAN(L.LightningModule):
    """Lightning's GAN tutorial, on 64-pixel digits: a generator and a discriminator, each with its Adam."""

    def __init__(self, lr: float = 2e-4, b1: float = 0.5, b2: float = 0.999, poison_at: int | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(LATENT, 32), nn.LeakyReLU(0.2), nn.Linear(32, 64), nn.Tanh())
        self.discriminator = nn.Sequential(nn.Linear(64, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1), nn.Sigmoid())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.generator(z)

    def adversarial_loss(self, y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy(y_hat, y)

    def training_step(self, batch: Any) -> None:
        imgs, z = batch
        optimizer_g, optimizer_d = self.optimizers()

        # train generator
        self.toggle_optimizer(optimizer_g)
        self.generated_imgs = self(z)
        valid = torch.ones(imgs.size(0), 1).type_as(imgs)
        g_loss = self.adversarial_loss(self.discriminator(self(z)), valid)
        if self.hparams["poison_at"] is not None and self.global_step >= self.hparams["poison_at"]:
            g_loss = g_loss * float("nan")  # a trial that diverges
        self.log("g_loss", g_loss, prog_bar=True)
        self.manual_backward(g_loss)
        optimizer_g.step()
        optimizer_g.zero_grad()
        self.untoggle_optimizer(optimizer_g)

        # train discriminator: how well it tells real from generated
        self.toggle_optimizer(optimizer_d)
        real_loss = self.adversarial_loss(self.discriminator(imgs), valid)
        fake = torch.zeros(imgs.size(0), 1).type_as(imgs)
        fake_loss = self.adversarial_loss(self.discriminator(self(z).detach()), fake)
        d_loss = (real_loss + fake_loss) / 2
        self.log("d_loss", d_loss, prog_bar=True)
        self.manual_backward(d_loss)
        optimizer_d.step()
        optimizer_d.zero_grad()
        self.untoggle_optimizer(optimizer_d)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        imgs, _ = batch
        self.log("val/d_real", self.discriminator(imgs).mean())

    def configure_optimizers(self) -> Any:
        lr, b1, b2 = self.hparams["lr"], self.hparams["b1"], self.hparams["b2"]
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(b1, b2))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(b1, b2))
        return [opt_g, opt_d], []


class ManualMLP(L.LightningModule):
    """An MLP on digits with the manual-optimization page's clipping, accumulation and self-stepped scheduler."""

    def __init__(self, lr: float = 0.1, clip: float | None = 0.5, accumulate: int = 2, gamma: float = 0.5) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self.net(x * 2 - 1), y)
        self.manual_backward(loss / self.hparams["accumulate"])
        if (batch_idx + 1) % self.hparams["accumulate"] == 0:
            if self.hparams["clip"] is not None:
                self.clip_gradients(opt, gradient_clip_val=self.hparams["clip"], gradient_clip_algorithm="norm")
            opt.step()
            opt.zero_grad()
        sch = self.lr_schedulers()
        if self.trainer.is_last_batch:
            sch.step()
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x * 2 - 1), y))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=self.hparams["gamma"])]
