"""The project's data: digits at MNIST's shape (lightning_hydro's demos), with the template's arguments."""

from lightning_hydro.demos.template_mnist import DigitsMNISTDataModule as MNISTDataModule

__all__ = ["MNISTDataModule"]
