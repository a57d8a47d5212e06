"""Trials never mix: a diverging trial is isolated; precision settings that would couple trials are refused."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from tests.helpers import fit_digits, make_trainer, max_state_difference, seeded, train_fused, train_separately


@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop"])
@pytest.mark.parametrize("optimizer_path", ["universal", "fused"])
def test_a_diverging_trial_is_stopped_and_the_others_are_untouched(backend, optimizer_path):
    lrs = [0.05, 1e6, 0.1]  # trial 1 blows up within a few steps
    trials = [
        seeded(lambda lr=lr: DigitsMLP(hidden_dim=16, lr=lr, optimizer="sgd"), [i])[0] for i, lr in enumerate(lrs)
    ]
    healthy = [trials[0], trials[2]]
    separate = train_separately(healthy, fit_digits, max_steps=30)
    fused = train_fused(
        trials, fit_digits, fused_kwargs={"backend": backend, "optimizer_path": optimizer_path}, max_steps=30
    )
    assert fused.results[1]["status"] == "diverged"
    assert fused.results[1]["reason"] in ("non-finite loss", "non-finite gradients")
    assert fused.results[1]["steps"] < 30
    assert fused.trial_ids == [0, 2]
    assert fused.stacked.get_parameter("head__weight").shape[0] == 2  # its slot was freed
    assert max_state_difference(fused.unfuse(0), separate[0]) <= 1e-5
    assert max_state_difference(fused.unfuse(2), separate[1]) <= 1e-5
    # its last finite weights are kept: the update that produced non-finite values was skipped
    assert all(torch.isfinite(p).all() for p in fused.unfuse(1).parameters())


class InfiniteLossMLP(DigitsMLP):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return super().training_step(batch, batch_idx) * float("inf")


def test_when_every_trial_diverges_training_stops():
    trials = [InfiniteLossMLP(hidden_dim=8) for _ in range(2)]
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    trainer = make_trainer(max_epochs=5)
    fit_digits(trainer, fused)
    assert fused.trial_ids == []
    assert {r["status"] for r in fused.results.values()} == {"diverged"}
    assert trainer.global_step <= 1  # training ended at the first check after the last trial stopped
    assert fused.results[0]["steps"] == 0  # no update was ever applied
    assert fused.results[0]["reason"] == "non-finite loss"


def test_bf16_mixed_trains_each_trial_like_a_separate_bf16_run():
    trials = [seeded(lambda lr=lr: DigitsMLP(hidden_dim=16, lr=lr), [i])[0] for i, lr in enumerate([0.05, 0.1])]
    separate = train_separately(trials, fit_digits, max_steps=10, precision="bf16-mixed")
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "vmap"}, max_steps=10, precision="bf16-mixed")
    for tid, module in enumerate(separate):
        assert max_state_difference(fused.unfuse(tid), module) <= 2e-2  # bf16 arithmetic
        assert fused.results[tid]["steps"] == 10


def test_fp16_mixed_is_refused_because_one_grad_scaler_couples_trials():
    fused = FusedLightningModule([DigitsMLP(hidden_dim=8), DigitsMLP(hidden_dim=8)], backend="vmap")
    trainer = make_trainer(max_steps=1)
    fused.trainer = trainer
    trainer.strategy.precision_plugin.precision = "16-mixed"  # on a GPU machine, what Trainer(precision=16) gives
    with pytest.raises(ValueError, match=r"does not support precision='16-mixed'.*Use precision='bf16-mixed'"):
        fused.setup("fit")
