"""The digits task: scikit-learn's bundled 8x8 handwritten digits (1,797 images, no download).

Used by the examples, the tests and the benchmarks: small enough to train dozens of trials on two CPU
cores, real enough that hyperparameters matter.

Example::

    >>> import lightning as L
    >>> dm = DigitsDataModule(batch_size=64)
    >>> model = DigitsMLP(hidden_dim=32, lr=0.1)
    >>> trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False,
    ...                     enable_checkpointing=False, enable_model_summary=False)
    >>> trainer.fit(model, datamodule=dm)
    >>> 0.0 <= float(trainer.callback_metrics["val_acc"]) <= 1.0
    True
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

__all__ = ["DigitsDataModule", "DigitsMLP", "load_digits_tensors"]

NUM_FEATURES = 64
NUM_CLASSES = 10


def load_digits_tensors(*, val_fraction: float = 0.2, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """Load scikit-learn's digits as (train, validation) tensor datasets, features scaled to [0, 1].

    The split is a fixed permutation drawn from ``seed``, so every trial of a sweep sees the same data.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"load_digits_tensors: val_fraction must be in (0, 1), got {val_fraction}.")
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "The digits task needs scikit-learn, which ships the data: pip install 'lightning-hydro[examples]'."
        ) from err
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_val = int(round(len(x) * val_fraction))
    val_idx, train_idx = order[:n_val], order[n_val:]
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[val_idx], y[val_idx])


class DigitsDataModule(L.LightningDataModule):
    """Digits as a LightningDataModule: shuffled training batches from a seeded generator.

    Args:
        batch_size: examples per training and validation batch.
        val_fraction: share of the 1,797 images held out for validation.
        seed: seeds both the split and the shuffling order, so reruns see identical batches.
    """

    def __init__(self, batch_size: int = 64, val_fraction: float = 0.2, seed: int = 0) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"DigitsDataModule: batch_size must be >= 1, got {batch_size}.")
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set, self.val_set = load_digits_tensors(val_fraction=self.val_fraction, seed=self.seed)

    def train_dataloader(self) -> DataLoader:
        assert self.train_set is not None  # set by setup(); Lightning always calls it first
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, generator=generator)

    def val_dataloader(self) -> DataLoader:
        assert self.val_set is not None
        return DataLoader(self.val_set, batch_size=256)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()


class DigitsMLP(L.LightningModule):
    """A small MLP classifier for digits, with the hyperparameters a sweep would tune.

    Args:
        hidden_dim: width of each hidden layer (the muP width hyperparameter).
        depth: number of hidden layers.
        lr: learning rate.
        momentum: SGD momentum (ignored by Adam/AdamW, which use ``betas``).
        weight_decay: weight decay of the optimizer.
        optimizer: ``"sgd"``, ``"adam"`` or ``"adamw"``.
        dropout: dropout probability after each hidden activation.
    """

    def __init__(
        self,
        hidden_dim: int = 64,
        depth: int = 2,
        lr: float = 0.05,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        optimizer: Literal["sgd", "adam", "adamw"] = "sgd",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if optimizer not in ("sgd", "adam", "adamw"):
            raise ValueError(f"DigitsMLP: optimizer must be 'sgd', 'adam' or 'adamw', got {optimizer!r}.")
        self.save_hyperparameters()
        layers: list[nn.Module] = []
        width_in = NUM_FEATURES
        for _ in range(depth):
            layers += [nn.Linear(width_in, hidden_dim), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width_in = hidden_dim
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width_in, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(-1) == y).float().mean())

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        if hp.optimizer == "sgd":
            return torch.optim.SGD(
                self.parameters(), lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay
            )
        if hp.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        return torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
