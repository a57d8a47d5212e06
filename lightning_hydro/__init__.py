"""lightning_hydro: fused, muP-scaled, early-stopped hyperparameter tuning for PyTorch Lightning.

The public API is imported lazily, so that ``import lightning_hydro.stopping`` (pure Python) and the
Hydra plugin shim, which Hydra imports at every application start, do not pay for torch and Lightning.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0.dev0"  # the release in the making (0.1.0 was the last); deprecations made now go in 0.3.0

_EXPORTS = {
    "FusedLightningModule": "lightning_hydro.fused",
    "ArchitectureMismatchError": "lightning_hydro.stacking",
    "FusionMismatchError": "lightning_hydro.fused",
    "FusionError": "lightning_hydro.backends",
}

__all__ = ["ArchitectureMismatchError", "FusedLightningModule", "FusionError", "FusionMismatchError", "__version__"]

if TYPE_CHECKING:
    from lightning_hydro.backends import FusionError
    from lightning_hydro.fused import FusedLightningModule, FusionMismatchError
    from lightning_hydro.stacking import ArchitectureMismatchError


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lightning_hydro' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
