"""Fusion is verified, not assumed: compare each trial's fused output with its own module's output.

vmap runs one template module's Python code for every trial, so a trial whose Python attributes differ
(a loss's ``label_smoothing``, a dropout ``p`` stored as a float) would silently compute with the
template's values. :func:`differing_attributes` lists such attributes; the fused module runs its check on
the first batch and raises :class:`FusionMismatchError` naming them.

Example::

    >>> from torch import nn
    >>> a = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1))
    >>> b = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
    >>> differing_attributes([a, b], ids=[0, 1])
    ['1.p (trial 0: 0.1, trial 1: 0.5)']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from lightning_hydro.backends.errors import FusionError

__all__ = ["FusionMismatchError", "differing_attributes"]

_SCALARS = (bool, int, float, str, type(None))
_IGNORED = {"training", "prepare_data_per_node", "allow_zero_length_dataloader_with_multiple_devices"}


class FusionMismatchError(FusionError):
    """A trial's fused output differs from its own module's output."""


def _plain(value: Any) -> bool:
    if isinstance(value, _SCALARS):
        return True
    return isinstance(value, (tuple, list)) and all(isinstance(v, _SCALARS) for v in value)


def _attributes(module: nn.Module) -> dict[str, Any]:
    """Plain Python attributes of every submodule (and the root's hparams), by dotted name."""
    found: dict[str, Any] = {}
    for prefix, sub in module.named_modules():
        for key, value in vars(sub).items():
            if key.startswith("_") or key in _IGNORED or not _plain(value):
                continue
            found[f"{prefix}.{key}" if prefix else key] = value
    hparams = getattr(module, "hparams", None)
    if hparams:
        for key, value in dict(hparams).items():
            if _plain(value):
                found[f"hparams.{key}"] = value
    return found


def differing_attributes(modules: Sequence[nn.Module], *, ids: Sequence[int]) -> list[str]:
    """Plain Python attributes whose values differ between the modules, as ``"name (trial a: x, trial b: y)"``."""
    reference = _attributes(modules[0])
    found: list[str] = []
    for tid, module in zip(ids[1:], modules[1:]):
        other = _attributes(module)
        for name in sorted(reference.keys() | other.keys()):
            a, b = reference.get(name, "<missing>"), other.get(name, "<missing>")
            if a != b and not any(entry.startswith(f"{name} ") for entry in found):
                found.append(f"{name} (trial {ids[0]}: {a}, trial {tid}: {b})")
    return found
