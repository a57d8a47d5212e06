"""The project's model: the template-shaped module and network of lightning_hydro's demos."""

from lightning_hydro.demos.template_mnist import MNISTLitModule, SimpleDenseNet

__all__ = ["MNISTLitModule", "SimpleDenseNet"]
