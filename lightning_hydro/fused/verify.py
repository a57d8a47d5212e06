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

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from lightning_hydro.backends.errors import FusionError
from lightning_hydro.backends.trial_logging import capture_logs

if TYPE_CHECKING:
    from lightning_hydro.backends.base import Backend
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["FusionMismatchError", "differing_attributes", "verify_fusion"]

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


@contextmanager
def _eval_mode(modules: Sequence[nn.Module]) -> Iterator[None]:
    modes = [(m, m.training) for module in modules for m in module.modules()]
    try:
        for module in modules:
            module.eval()
        yield
    finally:
        for m, mode in modes:
            m.training = mode


def _loss(output: Any) -> Tensor | None:
    return output.get("loss") if isinstance(output, dict) else output


def _mismatch(a: Tensor, b: Tensor) -> bool:
    """More than a 1e-3 relative difference (float rounding of vmap versus a plain call stays near 1e-7)."""
    a, b = a.detach().double(), b.detach().double()
    return bool((a - b).norm() > 1e-3 * b.norm() + 1e-7)


def verify_fusion(group: StackedState, backend: Backend, ids: Sequence[int], batch: Any, batch_idx: int) -> bool:
    """Compare each trial's fused ``training_step`` loss and gradients with its own module's.

    Runs in eval mode (no dropout, no BatchNorm statistics updates), in full precision, on a forked random
    number generator, without touching any ``.grad``. Gradients are compared because a loss alone can hide a
    difference (label smoothing barely changes the loss of an untrained, near-uniform classifier, but changes
    its gradient).

    Returns:
        False if the step returned no loss for this batch (check again on the next one).

    Raises:
        FusionMismatchError: naming the trial and the Python attributes that differ between trials.
    """
    modules = list(group.modules)
    names = list(group.params)
    stacked = [group.params[name] for name in names]
    device = stacked[0].device
    # in full precision: under bf16 autocast two correct computations already differ at the 1e-2 level
    with (
        _eval_mode(modules),
        torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
        torch.autocast(device.type, enabled=False),
    ):
        fused = backend.run("training_step", batch, batch_idx).loss()
        if fused is None:
            return False
        fused_grads = torch.autograd.grad(fused.sum(), stacked, allow_unused=True)
        for tid in ids:
            row = group.row_of(tid)
            module = modules[row]
            with capture_logs(module):
                own = _loss(module.training_step(batch, batch_idx))  # type: ignore[operator]
            assert own is not None
            own_params = [module.get_parameter(name) for name in names]
            own_grads = torch.autograd.grad(own, own_params, allow_unused=True)
            differs = _mismatch(fused[row], own) or any(
                (f is None) != (o is None) or (f is not None and o is not None and _mismatch(f[row], o))
                for f, o in zip(fused_grads, own_grads)
            )
            if differs:
                attrs = differing_attributes(modules, ids=group.trial_ids)
                hint = (
                    "these Python attributes differ between trials: " + "; ".join(attrs[:10])
                    if attrs
                    else "no plain Python attribute differs; look for state the step reads that is not a "
                    "parameter or buffer"
                )
                raise FusionMismatchError(
                    f"FusedLightningModule(backend={backend.name!r}): trial {tid}'s fused training_step loss "
                    f"{float(fused[row]):.6g} (or its gradients) differs from its own module's {float(own):.6g}. "
                    f"{backend.name} runs one template module's code for every trial, so attributes that differ "
                    f"are ignored; {hint}. Use backend='loop', or make the differing value a parameter or buffer."
                )
    return True
