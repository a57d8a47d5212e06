"""ResNet-18 on the digits upsampled to 32x32: a GPU-sized model on data that ships with scikit-learn.

The network has the layout of torchvision's ``resnet18`` (a stem, four stages of two ``BasicBlock``s with
64, 128, 256 and 512 channels, strided 3x3 convolutions and 1x1 projection shortcuts between stages, global
average pooling, a Linear head; the same parameter names), with the stem CIFAR variants use for 32x32 inputs:
a 3x3 stride-1 convolution and no max pooling. ``width`` sets the channels of the first stage (64 is the real
ResNet-18; 8 trains on a CPU in seconds). The data: scikit-learn's 1,797 8x8 digits, bilinearly upsampled to
32x32, standardised with the training split's mean and standard deviation, as 1 or 3 (repeated) channels, with
the fixed split of :func:`~lightning_hydro.demos.load_digits_tensors`. The LightningModule is shaped as
``DigitsMLP``: hyperparameters in ``__init__``, SGD with momentum and weight decay in ``configure_optimizers``.

Example::

    >>> import lightning as L
    >>> model = DigitsResNet(width=4, lr=0.05)
    >>> trainer = L.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, logger=False,
    ...                     enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    >>> trainer.fit(model, datamodule=Digits32DataModule(batch_size=32))
    >>> 0.0 <= float(trainer.callback_metrics["val_acc"]) <= 1.0
    True
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset
from typing_extensions import override

from lightning_hydro.demos.digits import NUM_CLASSES, DigitsClassifier, DigitsDataModule, load_digits_tensors

__all__ = ["BasicBlock", "Digits32DataModule", "DigitsResNet", "ResNet18", "load_digits_32"]

IMAGE_SIDE = 32


def load_digits_32(
    *, channels: int = 3, val_fraction: float = 0.2, seed: int = 0
) -> tuple[TensorDataset, TensorDataset]:
    """Load the digits as ``[N, channels, 32, 32]`` (train, validation) datasets.

    The 8x8 images are upsampled bilinearly and standardised with the training split's pixel mean and standard
    deviation; the split is :func:`~lightning_hydro.demos.load_digits_tensors`'s for the same ``seed``.

    Args:
        channels: 1 (grey) or 3 (the grey image repeated, as an RGB network expects).
        val_fraction: share of the images held out for validation.
        seed: seeds the split.
    """
    if channels not in (1, 3):
        raise ValueError(f"load_digits_32: channels must be 1 or 3, got {channels}.")
    train, val = load_digits_tensors(val_fraction=val_fraction, seed=seed)

    def upsample(images: torch.Tensor) -> torch.Tensor:
        small = images.view(-1, 1, 8, 8)
        return F.interpolate(small, size=(IMAGE_SIDE, IMAGE_SIDE), mode="bilinear", align_corners=False)

    train_x, val_x = upsample(train.tensors[0]), upsample(val.tensors[0])
    mean, std = train_x.mean(), train_x.std()
    train_x, val_x = ((x - mean) / std for x in (train_x, val_x))
    if channels == 3:
        train_x, val_x = train_x.expand(-1, 3, -1, -1).contiguous(), val_x.expand(-1, 3, -1, -1).contiguous()
    return TensorDataset(train_x, train.tensors[1]), TensorDataset(val_x, val.tensors[1])


class Digits32DataModule(DigitsDataModule):
    """The 32x32 digits as a LightningDataModule.

    :class:`~lightning_hydro.demos.DigitsDataModule`'s split, shuffling and loaders, with the images of
    :func:`load_digits_32`.

    Args:
        batch_size: examples per training batch (validation batches hold 256).
        channels: 1 or 3 input channels.
        val_fraction: share of the 1,797 images held out for validation.
        seed: seeds the split and the shuffling order, so reruns see identical batches.
    """

    def __init__(self, batch_size: int = 128, channels: int = 3, val_fraction: float = 0.2, seed: int = 0) -> None:
        if channels not in (1, 3):
            raise ValueError(f"Digits32DataModule: channels must be 1 or 3, got {channels}.")
        if batch_size < 1:
            raise ValueError(f"Digits32DataModule: batch_size must be >= 1, got {batch_size}.")
        super().__init__(batch_size=batch_size, val_fraction=val_fraction, seed=seed)
        self.channels = channels

    @override
    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set, self.val_set = load_digits_32(
                channels=self.channels, val_fraction=self.val_fraction, seed=self.seed
            )


def _conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a shortcut (a 1x1 projection where the shape changes).

    Args:
        in_planes: input channels.
        planes: output channels.
        stride: stride of the first convolution and of the projection.
    """

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_planes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """ResNet-18 for 32x32 images: torchvision's layout and names, the 3x3 stem of CIFAR variants.

    Args:
        width: channels of the first stage; the stages have ``width * (1, 2, 4, 8)`` (64: the real ResNet-18).
        in_channels: channels of the input images.
        num_classes: outputs of the Linear head.

    Example::

        >>> net = ResNet18(width=8)
        >>> net(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(self, width: int = 64, in_channels: int = 3, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        if width < 1 or in_channels < 1 or num_classes < 1:
            raise ValueError(
                f"ResNet18: width, in_channels and num_classes must be >= 1, got {width}, {in_channels} and "
                f"{num_classes}."
            )
        self.conv1 = _conv3x3(in_channels, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity()  # ImageNet's 3x3 max pooling would leave 32x32 inputs too small
        self.layer1 = self._stage(width, width, stride=1)
        self.layer2 = self._stage(width, 2 * width, stride=2)
        self.layer3 = self._stage(2 * width, 4 * width, stride=2)
        self.layer4 = self._stage(4 * width, 8 * width, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * width, num_classes)
        for module in self.modules():  # torchvision's initialisation
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    @staticmethod
    def _stage(in_planes: int, planes: int, stride: int) -> nn.Sequential:
        return nn.Sequential(BasicBlock(in_planes, planes, stride), BasicBlock(planes, planes))

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class DigitsResNet(DigitsClassifier):
    """ResNet-18 classifying the 32x32 digits, trained by SGD with momentum and weight decay.

    Args:
        width: channels of the first stage (64: the real ResNet-18).
        in_channels: 1 or 3, as the data module's ``channels``.
        lr: learning rate.
        momentum: SGD momentum.
        weight_decay: SGD weight decay.
        nesterov: Nesterov momentum.
    """

    def __init__(
        self,
        width: int = 64,
        in_channels: int = 3,
        lr: float = 0.05,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        nesterov: bool = False,
    ) -> None:
        super().__init__()
        if lr <= 0 or not 0.0 <= momentum < 1.0 or weight_decay < 0:
            raise ValueError(
                f"DigitsResNet: expected lr > 0, 0 <= momentum < 1 and weight_decay >= 0, got lr={lr}, "
                f"momentum={momentum}, weight_decay={weight_decay}."
            )
        if nesterov and momentum == 0:
            raise ValueError("DigitsResNet: nesterov=True needs momentum > 0 (torch.optim.SGD's rule), got 0.")
        self.save_hyperparameters()
        self.net = ResNet18(width=width, in_channels=in_channels)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    @override
    def configure_optimizers(self) -> Any:
        hp = self.hparams
        return torch.optim.SGD(
            self.parameters(),
            lr=hp["lr"],
            momentum=hp["momentum"],
            weight_decay=hp["weight_decay"],
            nesterov=hp["nesterov"],
        )
