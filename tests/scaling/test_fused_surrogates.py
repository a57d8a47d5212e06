"""muP surrogates train fused exactly as they train alone, on the fused optimizer path, and resume."""

from __future__ import annotations

import copy

import lightning as L
import pytest

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.scaling import Surrogate
from lightning_hydro.scaling.width_scaling import width_scaling_of
from tests.helpers import fit_digits, make_trainer, max_state_difference, seeded, train_fused, train_separately


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_surrogates_fuse_exactly_on_the_fused_optimizer_path(backend, optimizer):
    s = Surrogate(DigitsMLP, width=["hidden_dim"], ratio=4)
    lrs = [0.05, 0.1, 0.3] if optimizer == "sgd" else [1e-3, 3e-3, 1e-2]
    trials = [
        seeded(lambda lr=lr: s.build(hidden_dim=128, lr=lr, optimizer=optimizer), [i])[0] for i, lr in enumerate(lrs)
    ]
    separate = train_separately(trials, fit_digits, max_steps=20)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": backend}, max_steps=20)
    assert fused._optimizer.active_path == "fused"  # muP's per-multiplier param groups, one vectorised update
    for tid, module in enumerate(separate):
        assert max_state_difference(fused.unfuse(tid), module) <= 1e-5
    assert width_scaling_of(fused.unfuse(0)).width_mult == 0.25


class AddSurrogate(L.Callback):
    def __init__(self, module: L.LightningModule) -> None:
        self.module = module

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            pl_module.stop_trial(0, "test")
            pl_module.add_trial(copy.deepcopy(self.module))


def test_a_refilled_surrogate_is_rebuilt_with_its_width_scaling_on_resume(tmp_path):
    s = Surrogate(DigitsMLP, width=["hidden_dim"], ratio=2)
    trials = [s.build(hidden_dim=64, lr=lr) for lr in (0.05, 0.1)]
    newcomer = s.build(hidden_dim=64, lr=0.2)
    short = dict(limit_train_batches=4, limit_val_batches=1)
    first = FusedLightningModule([copy.deepcopy(t) for t in trials], backend="vmap", summary=False)
    trainer = make_trainer(max_epochs=2, callbacks=[AddSurrogate(newcomer)], **short)
    fit_digits(trainer, first)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    resumed = FusedLightningModule([copy.deepcopy(t) for t in trials], backend="vmap", summary=False)
    fit_digits(make_trainer(max_epochs=3, **short), resumed, ckpt_path=tmp_path / "mid.ckpt")
    rebuilt = resumed.trial_module(2)
    assert width_scaling_of(rebuilt).width_mult == 0.5  # rebuilt as DigitsMLP(**hparams), scaling re-attached
    assert rebuilt.hparams.hidden_dim == 32
    assert resumed.results[2]["steps"] == 8
