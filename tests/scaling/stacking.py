"""muP trials trained fused through the library's own core, outside Lightning.

The pieces ``FusedLightningModule`` assembles for a training step, without a Trainer: the stacked storage
with every trial bound to its row (:class:`~lightning_hydro.stacking.StackedState`), one vmapped forward of
all rows (:class:`~lightning_hydro.backends.vmap_backend.VmapBackend`), the sum of the trial losses, and the
group optimizer stepping each trial with its own ``configure_optimizers()`` optimizer
(:class:`~lightning_hydro.optim.group_optimizer.TrialGroupOptimizer`; per-tensor muP learning rates are
param-group options, so the fused update and the universal path both honour them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from lightning_hydro.backends.vmap_backend import VmapBackend
from lightning_hydro.fused.step.select_update import select_fused_update
from lightning_hydro.optim.group_optimizer import TrialGroupOptimizer
from lightning_hydro.optim.optimizer_config import parse_optimizer_config
from lightning_hydro.stacking import StackedState


def vmapped_forward(models: Sequence[nn.Module], inputs: torch.Tensor) -> torch.Tensor:
    """Outputs ``[B, ...]`` of the stacked ``models`` on shared ``inputs``, through one vmapped call."""
    group = StackedState(nn.Module(), list(models), list(range(len(models))))
    output = VmapBackend(group).run("forward", inputs).output
    assert isinstance(output, torch.Tensor)
    return output


class StackedTrials:
    """Trains ``models`` fused: one vmapped forward/backward per step, each trial its own optimizer."""

    def __init__(self, models: Sequence[nn.Module], loss: Callable[[torch.Tensor, Any], torch.Tensor]) -> None:
        self.models = list(models)
        self.loss = loss
        ids = list(range(len(self.models)))
        self.group = StackedState(nn.Module(), self.models, ids)
        self.backend = VmapBackend(self.group)
        trials = {
            tid: parse_optimizer_config(m.configure_optimizers(), trial_id=tid, module=m)  # type: ignore[operator]
            for tid, m in zip(ids, self.models)
        }
        self.optimizer = TrialGroupOptimizer(self.group, trials, fast_path=select_fused_update)

    def __call__(self, batch: Any) -> None:
        def closure() -> None:
            outputs = self.backend.run("forward", batch[0]).output
            assert isinstance(outputs, torch.Tensor)
            total = torch.stack([self.loss(outputs[i], batch) for i in range(len(self.models))]).sum()
            total.backward()

        self.optimizer.zero_grad()
        self.optimizer.step(closure)
