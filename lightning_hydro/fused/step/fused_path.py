"""``FusedPath``: the group optimizer's fused fast path, from clipped gradients to updated rows, on the device.

After Lightning's closure (the fused ``training_step``, backward, and clipping) the group optimizer hands its
fused path the rows to skip for a non-finite loss (a ``[B]`` device mask from :mod:`.row_health`). The path

1. finds the rows whose gradients are not finite: from the per-row norms when gradients were just clipped by
   norm (:meth:`FusedPath.clip_norm` computed them), else from one sum per parameter;
2. runs the fused update (:mod:`.fused_update`) with both kinds of rows skipped;
3. returns the rows with non-finite gradients and every row it skipped, still on the device.

Nothing is read back to the host, so on a GPU the CPU never waits for it here.

Example::

    >>> import torch
    >>> from lightning_hydro.fused.step.fused_update import FusedSGDUpdate
    >>> weight = torch.nn.Parameter(torch.zeros(2, 3))
    >>> path = FusedPath(FusedSGDUpdate([weight]))
    >>> weight.grad = torch.tensor([[1.0, 1.0, 1.0], [float("nan"), 0.0, 0.0]])
    >>> groups = [[{"lr": 0.1, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False}]] * 2
    >>> bad, skipped = path.step(groups, skip_loss=torch.tensor([False, False]))
    >>> bad.tolist()  # row 1: non-finite gradients
    [False, True]
    >>> weight.tolist()  # row 0 stepped, row 1 kept as it was
    [[-0.10000000149011612, -0.10000000149011612, -0.10000000149011612], [0.0, 0.0, 0.0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_hydro.fused.step.fused_update import FusedUpdate, select_fused_update
from lightning_hydro.optim.clipping import clip_grad_norm_per_trial, clip_grad_value_per_trial

__all__ = ["FusedPath", "select_fused_path"]


class FusedPath:
    """Per-row clipping, the rows to skip and one vectorised update of a fused group (no host sync).

    Args:
        update: the fused SGD/Adam/AdamW update of the group's stacked parameters.
    """

    def __init__(self, update: FusedUpdate) -> None:
        self.update = update
        # per-row gradient norms of the latest clipping, with the gradients (and their versions) they describe
        self._norms: tuple[Tensor, list[tuple[Tensor, int]]] | None = None
        # small groups: one concatenation and one sum beat a reduction per parameter (launches, on a GPU)
        self._concatenate = sum(p.numel() for p in update.params) <= _CONCATENATED_CHECK

    def _grads(self) -> list[Tensor]:
        return [p.grad for p in self.update.params if p.grad is not None]

    def clip_norm(self, max_norm: float, norm_type: float = 2.0) -> Tensor:
        """Clip each row's gradients to a total norm of ``max_norm``; returns the ``[B]`` norms before clipping."""
        norms = clip_grad_norm_per_trial(self.update.params, max_norm, norm_type)
        self._norms = (norms, [(g, g._version) for g in self._grads()])
        return norms

    def clip_value(self, clip_value: float) -> None:
        """Clamp every gradient element to ``[-clip_value, clip_value]``."""
        clip_grad_value_per_trial(self.update.params, clip_value)

    def _non_finite(self) -> Tensor:
        """``[B]`` bool: rows with a NaN or inf gradient (or a sum that overflows), on the device."""
        grads = self._grads()
        norms, self._norms = self._norms, None
        if norms is not None and _unchanged(norms[1], grads):
            return _not_finite(norms[0])  # the gradients are those the norms were taken of
        if not grads:
            return torch.zeros(self.update.rows, dtype=torch.bool, device=self.update.device)
        # a NaN or inf anywhere in a row makes that row's sum non-finite (an overflow to inf counts too)
        rows = [g.view(g.shape[0], -1) for g in grads]
        if self._concatenate:
            return _not_finite(torch.cat(rows, 1).sum(1))
        return _not_finite(torch.stack([r.sum(1) for r in rows]).sum(0))

    def step(self, param_groups: Sequence[Sequence[dict[str, Any]]], skip_loss: Tensor) -> tuple[Tensor, Tensor]:
        """Update every row but ``skip_loss``'s and those with non-finite gradients.

        Args:
            param_groups: each row's optimizer's ``param_groups`` (the hyperparameters, as schedulers left them).
            skip_loss: ``[B]`` bool, the rows not to step (a non-finite loss, or diverged earlier).

        Returns:
            ``[B]`` bool masks, on the device: the rows with non-finite gradients, and every row not stepped.
        """
        bad = self._non_finite()
        skip = skip_loss | bad
        self.update.step(param_groups, skip_rows=skip)
        return bad, skip

    def export_row(self, row: int) -> list[dict[str, Tensor]]:
        """Row ``row``'s optimizer state in torch's per-parameter format."""
        return self.update.export_row(row)

    def import_row(self, row: int, states: Sequence[dict[str, Any]]) -> None:
        """Load row ``row``'s optimizer state from torch's per-parameter format."""
        self.update.import_row(row, states)

    def state_tensors(self) -> list[Tensor]:
        """Every stacked state tensor the update holds (for memory accounting)."""
        return self.update.state_tensors()


# at most this many elements in all (B rows included): the non-finite check concatenates the gradients
_CONCATENATED_CHECK = 1 << 16


def _not_finite(values: Tensor) -> Tensor:
    """``values * 0`` is 0 where finite, NaN where not: two small ops (``torch.isfinite`` takes five)."""
    return (values * 0) != 0


def _unchanged(seen: list[tuple[Tensor, int]], grads: list[Tensor]) -> bool:
    """Whether ``grads`` are the very tensors seen, unchanged since (no new backward, no in-place change)."""
    return len(seen) == len(grads) and all(g is s and g._version == v for (s, v), g in zip(seen, grads))


def select_fused_path(
    optimizers: Sequence[torch.optim.Optimizer],
    trial_params: Sequence[Sequence[torch.nn.Parameter]],
    stacked: Sequence[torch.nn.Parameter],
    *,
    compile: bool | str = False,
) -> FusedPath | str:
    """The fused path for these trial optimizers, or why they need the universal path.

    See :func:`~lightning_hydro.fused.step.fused_update.select_fused_update` for when the fused path applies.

    Args:
        optimizers: each trial's optimizer, in row order.
        trial_params: each trial's parameters in the order of the stacked parameters.
        stacked: the stacked parameters.
        compile: run the update's device work under ``torch.compile`` (see :mod:`.compiled_update`).
    """
    update = select_fused_update(optimizers, trial_params, stacked)
    if isinstance(update, str):
        return update
    update.compile(compile)
    return FusedPath(update)
