"""Fault injection for fusion: a fault is either refused with its reason or stays inside its own trial.

Each test injects one fault that used to be silently wrong, crash, or raise a false alarm, and checks the
outcome on every backend it concerns.
"""

from __future__ import annotations

import warnings
from typing import Any

import lightning as L
import pytest
import torch

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from tests.helpers import fit_digits, max_state_difference, seeded, train_fused, train_separately

# -- a scheduler on the fused optimizer path: no false "lr_scheduler.step() before optimizer.step()" ----------


class WarmupMLP(DigitsMLP):
    """A linear learning-rate warm-up stepped every optimizer step, the usual transformer recipe."""

    def configure_optimizers(self) -> Any:
        optimizer = super().configure_optimizers()
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 5))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


def _scheduler_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "lr_scheduler.step()" in str(w.message)]


@pytest.mark.parametrize("optimizer_path", ["fused", "universal"])
def test_a_scheduled_fused_run_warns_of_no_skipped_schedule_and_follows_it(optimizer_path):
    trials = [seeded(lambda lr=lr: WarmupMLP(hidden_dim=16, lr=lr), [i])[0] for i, lr in enumerate([0.05, 0.2])]
    separate = train_separately(trials, fit_digits, max_steps=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fused = train_fused(
            trials, fit_digits, fused_kwargs={"backend": "vmap", "optimizer_path": optimizer_path}, max_steps=8
        )
    assert fused._optimizer is not None and fused._optimizer.active_path == optimizer_path
    assert _scheduler_warnings(caught) == []
    for tid, module in enumerate(separate):
        own = fused._optimizer.trials[tid]
        assert own.optimizer.param_groups[0]["lr"] == module.trainer.optimizers[0].param_groups[0]["lr"]
        assert max_state_difference(fused.unfuse(tid), module) <= 1e-6


def test_torch_still_warns_when_a_trials_scheduler_really_steps_before_any_update():
    fused = FusedLightningModule([WarmupMLP(hidden_dim=8), WarmupMLP(hidden_dim=8)], backend="vmap", summary=False)
    _, schedulers = fused.configure_optimizers()
    with pytest.warns(UserWarning, match=r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`"):
        schedulers[0]["scheduler"].step()
