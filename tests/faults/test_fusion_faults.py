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
import torch.nn.functional as F

from lightning_hydro import FusedLightningModule, FusionError
from lightning_hydro.demos import DigitsMLP
from tests.helpers import fit_digits, make_trainer, max_state_difference, seeded, train_fused, train_separately

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
    assert fused._optimizer is not None
    assert fused._optimizer.active_path == optimizer_path
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


# -- an ordinary error under vmap: auto falls back to loop and says why; an explicit vmap names the line ------


class RunningLogitsMLP(DigitsMLP):
    """Keeps a running sum of its logits in a plain tensor attribute (not a registered buffer)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.logit_sum = torch.zeros(32, 10)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        # one tensor shared by all trials, per-trial values: fails under vmap
        self.logit_sum += logits.detach()
        return F.cross_entropy(logits, y)


def _fit_batches_of_32(trainer: L.Trainer, module: L.LightningModule) -> None:
    fit_digits(trainer, module, batch_size=32)


def test_auto_falls_back_to_loop_when_vmap_fails_with_an_ordinary_error():
    trials = [seeded(lambda lr=lr: RunningLogitsMLP(hidden_dim=8, lr=lr), [i])[0] for i, lr in enumerate([0.05, 0.2])]
    separate = train_separately(trials, _fit_batches_of_32, max_steps=3)
    fused = train_fused(trials, _fit_batches_of_32, fused_kwargs={"backend": "auto"}, max_steps=3)
    assert fused.backend == "loop"
    assert (
        f"vmap skipped: backend='vmap' failed in RunningLogitsMLP.training_step at {__file__}" in fused.backend_report
    )
    for tid, module in enumerate(separate):
        assert max_state_difference(fused.unfuse(tid), module) <= 1e-6


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_an_explicit_fused_backend_names_the_failing_line_and_suggests_loop(backend):
    fused = FusedLightningModule([RunningLogitsMLP(hidden_dim=8) for _ in range(2)], backend=backend, summary=False)
    with pytest.raises(
        FusionError,
        match=rf"backend='{backend}' failed in RunningLogitsMLP.training_step at .*test_fusion_faults.py:\d+ in "
        r"training_step: self.logit_sum \+= logits.detach\(\): RuntimeError: output with shape \[32, 10\] doesn't "
        r"match the broadcast shape \[2, 32, 10\].*Use backend='loop'",
    ):
        _fit_batches_of_32(make_trainer(max_steps=1), fused)
