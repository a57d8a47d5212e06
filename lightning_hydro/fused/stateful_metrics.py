"""Find torchmetrics metrics that a step updates: vmap cannot keep their state per trial.

A ``torchmetrics.Metric`` updated inside a step accumulates state in Python attributes, not in parameters
or buffers, so under vmap one template metric would receive every trial's values (and keep tensors that
escaped the vmap). The fused module asks, once per step method, which metrics the method updates by
running it on a throw-away deep copy of one trial module; such methods run with the loop backend
(evaluation) or are refused under vmap (training).

Example::

    >>> import torch, torchmetrics, lightning as L
    >>> class M(L.LightningModule):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.layer = torch.nn.Linear(4, 3)
    ...         self.acc = torchmetrics.Accuracy(task="multiclass", num_classes=3)
    ...     def validation_step(self, batch, batch_idx):
    ...         self.acc(self.layer(batch[0]), batch[1])
    >>> batch = (torch.randn(5, 4), torch.randint(0, 3, (5,)))
    >>> updated_metrics(M(), "validation_step", (batch, 0), trainer=None)
    ['acc']
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from lightning_hydro.backends.trial_logging import capture_logs

__all__ = ["has_metrics", "updated_metrics"]


def _metrics(module: nn.Module) -> dict[str, Any]:
    try:
        from torchmetrics import Metric
    except ImportError:  # pragma: no cover - torchmetrics is a dependency of Lightning
        return {}
    return {name: m for name, m in module.named_modules() if isinstance(m, Metric)}


def has_metrics(module: nn.Module) -> bool:
    """Whether the module holds any torchmetrics ``Metric``."""
    return bool(_metrics(module))


def updated_metrics(module: nn.Module, method: str, args: tuple[Any, ...], *, trainer: Any) -> list[str]:
    """Names of the module's metrics that ``method(*args)`` updates, found on a deep copy (no side effects)."""
    if not has_metrics(module):
        return []
    probe = copy.deepcopy(module)
    if trainer is not None:
        probe.trainer = trainer  # a deep copy of a LightningModule drops it
    before = {name: m.update_count for name, m in _metrics(probe).items()}
    with torch.no_grad(), torch.random.fork_rng(), capture_logs(probe):
        getattr(probe, method)(*args)
    return sorted(name for name, m in _metrics(probe).items() if m.update_count != before[name])
