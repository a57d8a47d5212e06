"""lightning_hydro: fused, muP-scaled, early-stopped hyperparameter tuning for PyTorch Lightning."""

__version__ = "0.1.0"

__all__ = ["__version__"]
