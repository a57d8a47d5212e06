from typing import Any

import torch
import torch.nn.functional as F
from lightning import LightningDataModule
from torch.utils.data import ConcatDataset, DataLoader, Dataset, TensorDataset, random_split


def digits_at_mnist_shape() -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's bundled handwritten digits, upsampled from 8x8 to MNIST's 1x28x28: a first and a second part."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
    labels = torch.tensor(digits.target, dtype=torch.long)
    half = len(labels) // 2
    return TensorDataset(images[:half], labels[:half]), TensorDataset(images[half:], labels[half:])


class MNISTDataModule(LightningDataModule):
    """Digits at MNIST's shape, split into train, validation and test sets (the template's MNIST module, offline).

    Args:
        data_dir: where the data would be kept (the digits ship with scikit-learn: nothing is written).
        train_val_test_split: sizes of the three sets; they add up to the 1,797 digits.
        batch_size: the global batch size, divided between the devices.
        num_workers: DataLoader workers.
        pin_memory: DataLoader pin_memory.
    """

    def __init__(
        self,
        data_dir: str = "data/",
        train_val_test_split: tuple[int, int, int] = (1_297, 250, 250),
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()

        # the init arguments as self.hparams, and in every checkpoint
        self.save_hyperparameters(logger=False)

        self.data_train: Dataset | None = None
        self.data_val: Dataset | None = None
        self.data_test: Dataset | None = None

        self.batch_size_per_device = batch_size

    @property
    def num_classes(self) -> int:
        return 10

    def prepare_data(self) -> None:
        digits_at_mnist_shape()  # the template downloads here; the digits are on disk already

    def setup(self, stage: str | None = None) -> None:
        if self.trainer is not None:
            if self.hparams.batch_size % self.trainer.world_size != 0:
                raise RuntimeError(
                    f"Batch size ({self.hparams.batch_size}) is not divisible by the number of devices "
                    f"({self.trainer.world_size})."
                )
            self.batch_size_per_device = self.hparams.batch_size // self.trainer.world_size

        # load and split once: Lightning calls setup for fit and again for test
        if not self.data_train and not self.data_val and not self.data_test:
            first, second = digits_at_mnist_shape()
            dataset = ConcatDataset(datasets=[first, second])
            self.data_train, self.data_val, self.data_test = random_split(
                dataset=dataset,
                lengths=self.hparams.train_val_test_split,
                generator=torch.Generator().manual_seed(42),
            )

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            dataset=self.data_train,
            batch_size=self.batch_size_per_device,
            num_workers=self.hparams.num_workers,
            pin_memory=self.hparams.pin_memory,
            shuffle=True,
        )

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            dataset=self.data_val,
            batch_size=self.batch_size_per_device,
            num_workers=self.hparams.num_workers,
            pin_memory=self.hparams.pin_memory,
            shuffle=False,
        )

    def test_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            dataset=self.data_test,
            batch_size=self.batch_size_per_device,
            num_workers=self.hparams.num_workers,
            pin_memory=self.hparams.pin_memory,
            shuffle=False,
        )

    def teardown(self, stage: str | None = None) -> None:
        pass

    def state_dict(self) -> dict[Any, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass
