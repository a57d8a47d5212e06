"""lightning_hydro: fused, muP-scaled, early-stopped hyperparameter tuning for PyTorch Lightning."""

from lightning_hydro.backends import FusionError
from lightning_hydro.fused import ArchitectureMismatchError, FusedLightningModule, FusionMismatchError

__version__ = "0.1.0"

__all__ = [
    "ArchitectureMismatchError",
    "FusedLightningModule",
    "FusionError",
    "FusionMismatchError",
    "__version__",
]
