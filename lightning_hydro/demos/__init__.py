"""Small, self-contained tasks that ship with the package (no downloads): used by examples, tests, benchmarks."""

from lightning_hydro.demos.char_lm import CharDataModule, CharTransformer
from lightning_hydro.demos.digits import DigitsDataModule, DigitsMLP, EpochShuffleSampler, load_digits_tensors
from lightning_hydro.demos.digits_resnet import Digits32DataModule, DigitsResNet, ResNet18, load_digits_32
from lightning_hydro.demos.template_mnist import DigitsMNISTDataModule, MNISTLitModule, SimpleDenseNet

__all__ = [
    "CharDataModule",
    "CharTransformer",
    "Digits32DataModule",
    "DigitsDataModule",
    "DigitsMLP",
    "DigitsMNISTDataModule",
    "DigitsResNet",
    "EpochShuffleSampler",
    "MNISTLitModule",
    "ResNet18",
    "SimpleDenseNet",
    "load_digits_32",
    "load_digits_tensors",
]
