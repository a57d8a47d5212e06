"""The tensor core: B trial modules' parameters and buffers stacked ``[B, ...]``, the trials kept bound.

Pure torch, below every other subpackage that touches tensors (``backends``, ``optim``, ``fused``): importing
it loads neither Lightning nor Hydra.
"""

from lightning_hydro.stacking.stacked_state import ArchitectureMismatchError, StackedState, check_same_architecture

__all__ = ["ArchitectureMismatchError", "StackedState", "check_same_architecture"]
