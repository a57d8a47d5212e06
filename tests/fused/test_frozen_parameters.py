"""Trials with a frozen part, as fine-tuning code writes it: ``self.backbone.requires_grad_(False)`` in ``__init__``.

The frozen parameters are stacked like the others and get no gradient. Before, the first-batch check asked autograd
for their gradients too, so vmap and hfta refused every such model ("cannot differentiate ...: One of the
differentiated Tensors does not require grad") and ``auto`` could only choose the loop.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import StopTrialAt, fit_digits, max_state_difference, seeded, train_fused, train_separately

LRS = (1e-3, 3e-3, 1e-2)


class FrozenBackboneMLP(L.LightningModule):
    """A digits classifier whose backbone is frozen; the optimizer gets the trainable parameters, or all of them."""

    def __init__(self, lr: float = 1e-3, only_trainable: bool = True) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone = nn.Sequential(nn.Linear(64, 32), nn.LayerNorm(32), nn.ReLU())
        self.backbone.requires_grad_(False)
        self.head = nn.Linear(32, 10)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.head(self.backbone(x)), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        params = self.parameters()
        if self.hparams["only_trainable"]:
            params = filter(lambda p: p.requires_grad, params)
        return torch.optim.AdamW(params, lr=self.hparams["lr"])


@pytest.mark.parametrize("only_trainable", [True, False])
@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop"])
def test_trials_with_a_frozen_backbone_fuse_and_train_as_alone(backend: str, only_trainable: bool) -> None:
    lrs = iter(LRS)
    modules = seeded(lambda: FrozenBackboneMLP(lr=next(lrs), only_trainable=only_trainable), range(len(LRS)))
    kwargs: dict[str, Any] = dict(max_steps=8, limit_val_batches=0)
    alone = train_separately(modules, fit_digits, **kwargs)
    fused = train_fused(modules, fit_digits, fused_kwargs=dict(backend=backend), callbacks=[StopTrialAt(4)], **kwargs)
    assert fused.results[1]["status"] == "stopped"
    for trial_id in (0, 2):
        trained = fused.unfuse(trial_id)
        assert max_state_difference(trained, alone[trial_id]) <= 1e-5
        assert torch.equal(trained.backbone[0].weight, modules[trial_id].backbone[0].weight)  # frozen: unchanged
        assert not trained.backbone[0].weight.requires_grad
