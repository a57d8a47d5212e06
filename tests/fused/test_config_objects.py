"""Per-trial values kept in config objects (Hydra's DictConfig, dataclasses, namespaces) fuse as plain ones do.

Before, the scan of the trials' Python values compared plain attributes and dict hparams only: a per-trial value in a
config object that the step reads after the first batch (a KL-style warm-up, ``min(1, step / anneal_steps)``, is 0
for every trial at step 0, where the first-batch check looks) ran with trial 0's value under vmap and hfta, a trial
0.31-0.59 relative from alone, silently. Now it is found by name (``hparams.anneal_steps``, ``loss_cfg.anneal_steps``):
vmap and hfta refuse it, ``auto`` runs the group on the loop, and every trial equals its run alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends.errors import FusionMismatchError
from lightning_hydro.demos import DigitsMLP
from tests.helpers import fit_digits, make_trainer, max_state_difference, seeded, train_fused, train_separately

FIT = dict(max_epochs=2, limit_train_batches=5, limit_val_batches=1)


class FromDictConfig(DigitsMLP):
    """``self.save_hyperparameters(cfg)`` with Hydra's config: ``self.hparams`` is the DictConfig."""

    def __init__(self, anneal_steps: int, lr: float) -> None:
        cfg = OmegaConf.create(
            {"lr": lr, "anneal_steps": anneal_steps, "optimizer": "sgd", "momentum": 0.9, "weight_decay": 0.0}
        )
        super().__init__(hidden_dim=16, lr=lr)
        self.save_hyperparameters(cfg)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        beta = min(1.0, self.global_step / self.hparams.anneal_steps)  # 0 for every trial at the first batch
        return F.cross_entropy(logits, y) + beta * logits.pow(2).mean()


@dataclass
class LossConfig:
    anneal_steps: int


class FromDataclass(DigitsMLP):
    """A dataclass of loss settings kept as an attribute."""

    def __init__(self, anneal_steps: int, lr: float) -> None:
        super().__init__(hidden_dim=16, lr=lr)
        self.loss_cfg = LossConfig(anneal_steps)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        beta = min(1.0, self.global_step / self.loss_cfg.anneal_steps)
        return F.cross_entropy(logits, y) + beta * logits.pow(2).mean()


def _trials(cls: type) -> list[DigitsMLP]:
    settings = iter([(2, 0.05), (7, 0.1)])
    return seeded(lambda: cls(*next(settings)), [0, 1])


@pytest.mark.parametrize("cls", [FromDictConfig, FromDataclass])
@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_a_per_trial_value_in_a_config_object_is_refused_on_the_vectorised_backends(cls: type, backend: str) -> None:
    name = "hparams.anneal_steps" if cls is FromDictConfig else "loss_cfg.anneal_steps"
    with pytest.raises(FusionMismatchError, match=rf"{name} \(trial 0: 2, trial 1: 7\)"):
        FusedLightningModule(_trials(cls), backend=backend, summary=False)


@pytest.mark.parametrize("cls", [FromDictConfig, FromDataclass])
def test_auto_trains_such_trials_on_the_loop_each_as_alone(cls: type) -> None:
    trials = _trials(cls)
    alone = train_separately(trials, fit_digits, **FIT)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "auto"}, **FIT)
    assert fused.backend == "loop"
    for row, own in enumerate(alone):
        assert max_state_difference(fused.unfuse(row), own) == 0.0


def test_trials_whose_config_objects_differ_only_in_what_their_optimizers_read_still_fuse() -> None:
    # the sweep's common case: the lr differs, read by each trial's own configure_optimizers only
    trials = seeded(lambda: FromDictConfig(5, 0.05), [0, 1])
    trials[1].hparams.lr = 0.2  # (DigitsMLP's optimizer reads hparams["lr"])
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    fit_digits(make_trainer(**FIT), fused)
    assert fused.backend == "vmap"


class ScaledByAHook(FromDictConfig):
    """A batch hook sets a per-trial scale in the DictConfig hparams, which the step reads."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.hparams.scale = 1.0 + self.hparams.lr * self.global_step

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x) * self.hparams.get("scale", 1.0), y)


def test_a_dictconfig_hparam_a_hook_makes_differ_is_refused_at_the_next_step() -> None:
    # the re-read after a trial's hook read Lightning's dict hparams only: a DictConfig's ran with trial 0's, silently
    fused = FusedLightningModule(_trials(ScaledByAHook), backend="vmap", summary=False)
    with pytest.raises(FusionMismatchError, match=r"hparams.scale \(trial 0: 1.05, trial 1: 1.1\)"):
        fit_digits(make_trainer(max_steps=4), fused)
