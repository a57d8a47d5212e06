"""A module and data module shaped like the most common Lightning + Hydra starting point.

lightning-hydra-template's ``MNISTLitModule`` is what many research projects begin from, so it is how we
check that fusion works on real code, unchanged. This file is our own code written to the same published
structure, with nothing adapted for fusion:

- the network is built outside and passed in (``net``; the template's ``SimpleDenseNet`` shape: Linear,
  BatchNorm1d, ReLU three times, then a Linear head, flattening its input with ``view(batch, -1)``);
- the optimizer and scheduler come in as partials (``functools.partial`` or Hydra's ``_partial_: true``) and
  ``configure_optimizers`` builds the optimizer from ``self.trainer.model.parameters()`` and returns a
  scheduler dict that monitors ``"val/loss"``;
- ``save_hyperparameters(logger=False, ignore=["net"])``, a ``CrossEntropyLoss`` attribute, and torchmetrics
  objects (``Accuracy``, ``MeanMetric``, ``MaxMetric``) updated in every step and logged as objects;
- ``on_train_start`` resets the validation metrics, ``on_validation_epoch_end`` tracks the best accuracy.

The data is scikit-learn's bundled digits upsampled from 8x8 to 28x28 (one channel), standing in for MNIST
without a download.

Example::

    >>> import functools, lightning as L, torch
    >>> model = MNISTLitModule(
    ...     net=SimpleDenseNet(lin1_size=32, lin2_size=32, lin3_size=16),
    ...     optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
    ...     scheduler=functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, mode="min", patience=2),
    ... )
    >>> trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False,
    ...                     enable_checkpointing=False, enable_model_summary=False)
    >>> trainer.fit(model, datamodule=DigitsMNISTDataModule(batch_size=128))
    >>> 0.0 <= float(trainer.callback_metrics["val/acc"]) <= 1.0
    True
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification.accuracy import Accuracy
from typing_extensions import override

__all__ = ["DigitsMNISTDataModule", "MNISTLitModule", "SimpleDenseNet", "load_digits_as_mnist"]

IMAGE_SIDE = 28


def load_digits_as_mnist() -> TensorDataset:
    """All 1,797 digits as ``[N, 1, 28, 28]`` float images in [0, 1] with their labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("The digits data ships with scikit-learn: pip install 'lightning-hydro[examples]'.") from err
    data = load_digits()
    small = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(small, size=(IMAGE_SIDE, IMAGE_SIDE), mode="bilinear", align_corners=False)
    return TensorDataset(images, torch.tensor(data.target, dtype=torch.long))


class DigitsMNISTDataModule(L.LightningDataModule):
    """Digits at MNIST's shape, with the template's data-module arguments.

    Args:
        data_dir: kept for the template's signature; nothing is downloaded or written.
        train_val_test_split: sizes of the three splits (they must add up to 1,797).
        batch_size: the global batch size, divided by the number of devices as the template does.
        num_workers: DataLoader workers.
        pin_memory: DataLoader ``pin_memory``.
        seed: seeds the split.
    """

    def __init__(
        self,
        data_dir: str = "data/",
        train_val_test_split: tuple[int, int, int] = (1297, 250, 250),
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 42,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.data_train: Any = None
        self.data_val: Any = None
        self.data_test: Any = None
        self.batch_size_per_device = batch_size

    @override
    def setup(self, stage: str | None = None) -> None:
        if self.trainer is not None:
            if self.hparams["batch_size"] % self.trainer.world_size != 0:
                raise RuntimeError(
                    f"Batch size ({self.hparams['batch_size']}) is not divisible by the number of devices "
                    f"({self.trainer.world_size})."
                )
            self.batch_size_per_device = self.hparams["batch_size"] // self.trainer.world_size
        if self.data_train is None:
            dataset = load_digits_as_mnist()
            lengths = list(self.hparams["train_val_test_split"])
            generator = torch.Generator().manual_seed(self.hparams["seed"])
            self.data_train, self.data_val, self.data_test = random_split(dataset, lengths, generator=generator)

    def _loader(self, dataset: Any, shuffle: bool) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size_per_device,
            num_workers=self.hparams["num_workers"],
            pin_memory=self.hparams["pin_memory"],
            shuffle=shuffle,
        )

    @override
    def train_dataloader(self) -> DataLoader:
        return self._loader(self.data_train, shuffle=True)

    @override
    def val_dataloader(self) -> DataLoader:
        return self._loader(self.data_val, shuffle=False)

    @override
    def test_dataloader(self) -> DataLoader:
        return self._loader(self.data_test, shuffle=False)


class SimpleDenseNet(nn.Module):
    """Three Linear-BatchNorm1d-ReLU blocks and a Linear head over a flattened image."""

    def __init__(
        self,
        input_size: int = IMAGE_SIDE * IMAGE_SIDE,
        lin1_size: int = 256,
        lin2_size: int = 256,
        lin3_size: int = 256,
        output_size: int = 10,
    ) -> None:
        super().__init__()
        sizes = [input_size, lin1_size, lin2_size, lin3_size]
        blocks: list[nn.Module] = []
        for width_in, width_out in itertools.pairwise(sizes):
            blocks += [nn.Linear(width_in, width_out), nn.BatchNorm1d(width_out), nn.ReLU()]
        self.model = nn.Sequential(*blocks, nn.Linear(lin3_size, output_size))

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch_size = x.size(0)
        return self.model(x.view(batch_size, -1))


class MNISTLitModule(L.LightningModule):
    """An image classifier with the template's structure (see the module docstring).

    Args:
        net: the network to train.
        optimizer: a partial that takes ``params`` and returns an optimizer.
        scheduler: a partial that takes ``optimizer`` and returns an LR scheduler, or None.
        compile: ``torch.compile`` the network at fit start.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any] | None,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["net"])
        self.net = net
        self.criterion = nn.CrossEntropyLoss()
        self.train_acc = Accuracy(task="multiclass", num_classes=10)
        self.val_acc = Accuracy(task="multiclass", num_classes=10)
        self.test_acc = Accuracy(task="multiclass", num_classes=10)
        self.train_loss = MeanMetric()
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        self.val_acc_best = MaxMetric()

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    @override
    def on_train_start(self) -> None:
        # the sanity check's batches must not count towards the best validation accuracy
        self.val_loss.reset()
        self.val_acc.reset()
        self.val_acc_best.reset()

    def model_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Loss, predicted classes and targets of one batch."""
        x, y = batch
        logits = self.forward(x)
        loss = self.criterion(logits, y)
        return loss, torch.argmax(logits, dim=1), y

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, preds, targets = self.model_step(batch)
        self.train_loss(loss)
        self.train_acc(preds, targets)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    @override
    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, preds, targets = self.model_step(batch)
        self.val_loss(loss)
        self.val_acc(preds, targets)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)

    @override
    def on_validation_epoch_end(self) -> None:
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    @override
    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, preds, targets = self.model_step(batch)
        self.test_loss(loss)
        self.test_acc(preds, targets)
        self.log("test/loss", self.test_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("test/acc", self.test_acc, on_step=False, on_epoch=True, prog_bar=True)

    @override
    def setup(self, stage: str) -> None:
        if self.hparams["compile"] and stage == "fit":
            self.net = torch.compile(self.net)  # type: ignore[assignment]

    @override
    def configure_optimizers(self) -> Any:
        optimizer = self.hparams["optimizer"](params=self.trainer.model.parameters())  # type: ignore[union-attr]
        if self.hparams["scheduler"] is None:
            return {"optimizer": optimizer}
        scheduler = self.hparams["scheduler"](optimizer=optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "monitor": "val/loss", "interval": "epoch", "frequency": 1},
        }
