"""Per-trial LR schedulers (interval, frequency, ReduceLROnPlateau on the trial's own metric) and clipping."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.optim import OptimizerConfigError
from tests.helpers import (
    ScheduledMLP,
    fit_digits,
    make_trainer,
    max_state_difference,
    seeded,
    train_fused,
    train_separately,
)


def lr_of(fused: FusedLightningModule, tid: int) -> float:
    return fused._optimizer.trials[tid].optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize("schedule", ["step", "epoch", "plateau"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_schedulers_step_each_trial_as_in_a_separate_run(schedule, optimizer):
    lrs = [0.3, 0.05, 0.01] if optimizer == "sgd" else [3e-2, 3e-3, 1e-3]
    trials = [
        seeded(lambda lr=lr: ScheduledMLP(schedule, hidden_dim=16, lr=lr, optimizer=optimizer), [i])[0]
        for i, lr in enumerate(lrs)
    ]
    separate = train_separately(trials, fit_digits, max_epochs=4, limit_train_batches=6)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "vmap"}, max_epochs=4, limit_train_batches=6)
    for tid, module in enumerate(separate):
        assert lr_of(fused, tid) == pytest.approx(module.trainer.optimizers[0].param_groups[0]["lr"])
        assert max_state_difference(fused.unfuse(tid), module) <= 1e-5
    if schedule == "plateau":  # the trials' own metrics drove their own schedules apart
        assert len({round(lr_of(fused, t) / lrs[t], 6) for t in range(3)}) > 1


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_gradient_clipping_is_per_trial(algorithm):
    # The loop backend computes each trial's gradients exactly as a separate run does, which isolates the
    # clipping itself; vmap's own rounding (~1e-7, amplified by these large learning rates) is covered by
    # the exactness tests.
    trials = [
        seeded(lambda lr=lr: DigitsMLP(hidden_dim=16, lr=lr, optimizer="sgd"), [i])[0]
        for i, lr in enumerate([0.5, 1.0, 2.0])
    ]
    kwargs = dict(max_steps=15, gradient_clip_val=0.05, gradient_clip_algorithm=algorithm)
    separate = train_separately(trials, fit_digits, **kwargs)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "loop"}, **kwargs)
    unclipped = train_fused(trials, fit_digits, fused_kwargs={"backend": "loop"}, max_steps=15)
    for tid, module in enumerate(separate):
        assert max_state_difference(fused.unfuse(tid), module) <= 1e-6
        assert max_state_difference(unclipped.unfuse(tid), module) > 1e-3  # clipping really happened


def test_optimizer_config_errors_name_the_trial():
    class NoOptimizer(DigitsMLP):
        def configure_optimizers(self) -> Any:
            return None

    fused = FusedLightningModule([DigitsMLP(hidden_dim=8), NoOptimizer(hidden_dim=8)], backend="vmap", summary=False)
    with pytest.raises(OptimizerConfigError, match="Trial 1: configure_optimizers\\(\\) returned None"):
        fit_digits(make_trainer(max_steps=1), fused)


def test_fused_optimizer_path_refuses_mixed_classes():
    trials = [DigitsMLP(hidden_dim=8, optimizer="sgd"), DigitsMLP(hidden_dim=8, optimizer="adam")]
    fused = FusedLightningModule(trials, backend="vmap", optimizer_path="fused", summary=False)
    with pytest.raises(ValueError, match=r"optimizer_path='fused'.*different optimizer classes \(Adam, SGD\)"):
        fit_digits(make_trainer(max_steps=1), fused)
