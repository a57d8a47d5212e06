"""Fusion backends: how B trials' steps run at once (vmap, hfta fused operators, loop; auto selection).

``HftaBackend`` and the fused-operator library live in ``lightning_hydro.backends.hfta_backend`` and
``lightning_hydro.backends.hfta``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from lightning_hydro.backends.base import Backend, StackedLog, StepOutputs
from lightning_hydro.backends.errors import FusionError
from lightning_hydro.backends.loop_backend import LoopBackend
from lightning_hydro.backends.vmap_backend import VmapBackend

if TYPE_CHECKING:
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "BackendName",
    "FusionError",
    "LoopBackend",
    "StackedLog",
    "StepOutputs",
    "VmapBackend",
    "make_backend",
]

BackendName = Literal["auto", "vmap", "hfta", "loop"]
BACKEND_NAMES: tuple[str, ...] = ("auto", "vmap", "hfta", "loop")


def make_backend(name: str, group: StackedState) -> Backend:
    """Build the backend called ``name`` ("vmap", "hfta" or "loop") for a stacked group."""
    if name == "vmap":
        if group.pad_widths:  # trials of different widths, zero-padded: the template carries the padded sizes
            from lightning_hydro.backends.padded_vmap import PaddedVmapBackend

            return PaddedVmapBackend(group)
        return VmapBackend(group)
    if name == "loop":
        return LoopBackend(group)
    if name == "hfta":
        if group.pad_widths:
            raise FusionError(
                "backend='hfta' does not fuse trials of different widths (pad_widths=True); use backend='vmap', "
                "'loop' or 'auto'."
            )
        from lightning_hydro.backends.hfta_backend import HftaBackend  # imports the operator library

        return HftaBackend(group)
    raise ValueError(f"Unknown backend {name!r}; expected one of {', '.join(repr(n) for n in BACKEND_NAMES)}.")
