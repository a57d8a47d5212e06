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

from collections.abc import Iterator
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset
from typing_extensions import override

__all__ = ["DigitsDataModule", "DigitsMLP", "EpochShuffleSampler", "load_digits_tensors"]

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
    n_val = round(len(x) * val_fraction)
    val_idx, train_idx = order[:n_val], order[n_val:]
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[val_idx], y[val_idx])


class EpochShuffleSampler(Sampler[int]):
    """Shuffles with a permutation drawn from ``(seed, epoch)`` alone.

    Lightning calls ``set_epoch`` at every epoch start, so a run resumed from a checkpoint sees the same
    batches in its later epochs as an uninterrupted run would.
    """

    def __init__(self, num_samples: int, seed: int = 0) -> None:
        self.num_samples = num_samples
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation of this epoch."""
        self.epoch = epoch

    @override
    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.num_samples, generator=generator).tolist())

    def __len__(self) -> int:
        return self.num_samples


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

    @override
    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set, self.val_set = load_digits_tensors(val_fraction=self.val_fraction, seed=self.seed)

    @override
    def train_dataloader(self) -> DataLoader:
        assert self.train_set is not None  # set by setup(); Lightning always calls it first
        sampler = EpochShuffleSampler(len(self.train_set), seed=self.seed)
        return DataLoader(self.train_set, batch_size=self.batch_size, sampler=sampler)

    @override
    def val_dataloader(self) -> DataLoader:
        assert self.val_set is not None
        return DataLoader(self.val_set, batch_size=256)

    @override
    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()


class DigitsClassifier(L.LightningModule):
    """The digits classifiers' shared training and validation steps.

    Cross-entropy on the logits ``forward`` gives; ``train_loss``, ``val_loss`` and ``val_acc`` logged.
    """

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    @override
    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        # sync_dist: under DDP each epoch value covers every process's share of the data
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(-1) == y).float().mean(), sync_dist=True)


class DigitsMLP(DigitsClassifier):
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

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    @override
    def configure_optimizers(self) -> Any:
        hp = self.hparams
        if hp["optimizer"] == "sgd":
            return torch.optim.SGD(
                self.parameters(), lr=hp["lr"], momentum=hp["momentum"], weight_decay=hp["weight_decay"]
            )
        optimizer = torch.optim.Adam if hp["optimizer"] == "adam" else torch.optim.AdamW
        return optimizer(self.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"])
