"""Gradual unfreezing, as fine-tuning code writes it: the trial freezes its backbone in ``on_train_epoch_start``.

Each trial toggles ``requires_grad`` of its own parameters (``self.backbone.requires_grad_(...)``, or Lightning's
``self.freeze()`` / ``self.unfreeze()``) from its own epoch on, so within one group some trials' rows of a stacked
tensor train while others' are frozen. A frozen row gets what torch gives a frozen parameter alone: no gradient, so
no step, no momentum, no weight decay, no Adam count. Before, the stacked tensor kept the flag it was stacked with:
the loop stepped the frozen rows (momentum and weight decay included; a trial 0.25 off alone in val_loss) and vmap
and hfta refused every such model ("One of the differentiated Tensors does not require grad").
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_hydro.backends.errors import FusionMismatchError
from tests.helpers import fit_digits, max_state_difference, seeded, train_fused, train_separately

UNFREEZE_AT = (1, 2, 0)  # trial 2 never frozen; trial 1 still frozen in epoch 1, when trial 0 trains
TOLERANCE = {"loop": 0.0, "vmap": 1e-5, "hfta": 1e-5, "auto": 1e-5}


class GraduallyUnfrozen(L.LightningModule):
    """A digits classifier whose backbone is frozen until epoch ``unfreeze_at``; every parameter is optimized."""

    def __init__(
        self, lr: float = 0.05, unfreeze_at: int = 1, how: str = "requires_grad", optimizer: str = "sgd"
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone = nn.Sequential(nn.Linear(64, 32), nn.LayerNorm(32), nn.ReLU())
        self.head = nn.Linear(32, 10)

    def on_train_epoch_start(self) -> None:
        frozen = self.current_epoch < self.hparams["unfreeze_at"]
        if self.hparams["how"] == "requires_grad":
            self.backbone.requires_grad_(not frozen)
        elif frozen:  # Lightning's freeze() freezes every parameter: the head trains on
            self.freeze()
            self.head.requires_grad_(True)
            self.train()  # freeze() also sets eval mode, which vmap and hfta run per trial only if alike (below)
        else:
            self.unfreeze()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.head(self.backbone(x)), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        if self.hparams["optimizer"] == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.hparams["lr"] / 10, weight_decay=1e-3)
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9, weight_decay=1e-3)


def _trials(**kwargs: Any) -> list[L.LightningModule]:
    settings = iter(zip((0.05, 0.1, 0.2), UNFREEZE_AT))
    return seeded(lambda: GraduallyUnfrozen(*next(settings), **kwargs), range(len(UNFREEZE_AT)))


@pytest.mark.parametrize("optimizer_path", ["universal", "fused"])
@pytest.mark.parametrize(("how", "optimizer"), [("requires_grad", "sgd"), ("freeze", "adam")])
@pytest.mark.parametrize("backend", ["loop", "vmap", "hfta", "auto"])
def test_trials_that_unfreeze_their_backbone_at_different_epochs_train_as_alone(
    backend: str, how: str, optimizer: str, optimizer_path: str
) -> None:
    modules = _trials(how=how, optimizer=optimizer)
    kwargs: dict[str, Any] = dict(max_epochs=3, limit_train_batches=3, limit_val_batches=0)
    alone = train_separately(modules, fit_digits, **kwargs)
    fused = train_fused(
        modules, fit_digits, fused_kwargs=dict(backend=backend, optimizer_path=optimizer_path), **kwargs
    )
    for trial_id, (module, unfreeze_at) in enumerate(zip(modules, UNFREEZE_AT)):
        trained = fused.unfuse(trial_id)
        assert max_state_difference(trained, alone[trial_id]) <= TOLERANCE[backend], trial_id
        moved = (trained.backbone[0].weight - module.backbone[0].weight).abs().max().item()
        assert (moved > 0) == (unfreeze_at < 3), trial_id  # a backbone never unfrozen in 3 epochs stays as it was


@pytest.mark.parametrize("backend", ["loop", "vmap"])
def test_a_backbone_frozen_in_every_trial_for_an_epoch_does_not_move(backend: str) -> None:
    class FrozenFirstEpoch(GraduallyUnfrozen):
        def on_train_epoch_start(self) -> None:
            self.backbone.requires_grad_(self.current_epoch >= 1)

    lrs = iter((0.05, 0.2))
    modules = seeded(lambda: FrozenFirstEpoch(next(lrs)), range(2))
    kwargs: dict[str, Any] = dict(max_epochs=1, limit_train_batches=3, limit_val_batches=0)
    alone = train_separately(modules, fit_digits, **kwargs)
    fused = train_fused(modules, fit_digits, fused_kwargs=dict(backend=backend), **kwargs)
    for trial_id, module in enumerate(modules):
        trained = fused.unfuse(trial_id)
        assert torch.equal(trained.backbone[0].weight, module.backbone[0].weight)
        assert max_state_difference(trained, alone[trial_id]) <= TOLERANCE[backend]


class FrozenIntoEvalMode(GraduallyUnfrozen):
    """``self.freeze()`` as Lightning defines it: it also puts the module in eval mode (BatchNorm stops tracking)."""

    def __init__(self, lr: float = 0.05, unfreeze_at: int = 1) -> None:
        super().__init__(lr, unfreeze_at, how="freeze")
        self.backbone = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU())

    def on_train_epoch_start(self) -> None:
        if self.current_epoch < self.hparams["unfreeze_at"]:
            self.freeze()
            self.head.requires_grad_(True)
        else:
            self.unfreeze()


def test_trials_that_freeze_into_eval_mode_at_different_epochs_are_refused_by_vmap_and_run_by_auto_on_the_loop() -> (
    None
):
    # one template's mode runs every trial under vmap and hfta: trials in different modes cannot run there
    settings = iter(zip((0.05, 0.1), (1, 0)))
    modules = seeded(lambda: FrozenIntoEvalMode(*next(settings)), range(2))
    kwargs: dict[str, Any] = dict(max_epochs=2, limit_train_batches=3, limit_val_batches=0)
    for backend in ("vmap", "hfta"):
        with pytest.raises(
            FusionMismatchError,
            match=r"trial 1's .* in training mode where trial 0's is in eval mode .*self\.freeze\(\)",
        ):
            train_fused(modules, fit_digits, fused_kwargs=dict(backend=backend), **kwargs)
    alone = train_separately(modules, fit_digits, **kwargs)
    fused = train_fused(modules, fit_digits, fused_kwargs=dict(backend="auto"), **kwargs)
    assert fused.backend == "loop"
    for trial_id in range(2):
        assert max_state_difference(fused.unfuse(trial_id), alone[trial_id]) == 0.0
