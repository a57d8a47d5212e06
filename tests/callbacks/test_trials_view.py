"""The two views of a callback's trials: decisions in the epoch where the metric is known, budgets in one unit."""

from __future__ import annotations

import lightning as L
import pytest
from lightning.pytorch.callbacks import Callback

from lightning_hydro.callbacks import ASHA, SuccessiveHalving
from lightning_hydro.callbacks.fused_trials import FusedTrials
from lightning_hydro.callbacks.halving_callback import HalvingCallback
from lightning_hydro.callbacks.process_trial import ProcessTrial
from tests.callbacks.trials import LEARNING_RATES, fit, fused, mlp


class OutcomesAtEpochEnd(Callback):
    """Records, at each training epoch's end (after the callback before it), how many trials it has ended."""

    def __init__(self, watched: HalvingCallback) -> None:
        self.watched = watched
        self.ended: list[int] = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.ended.append(len(self.watched.endings))


def test_without_validation_a_fused_group_is_judged_in_the_epoch_its_values_come_from():
    """It used to be judged when the next epoch started (the module publishes its epoch values after the hook)."""
    module = fused(LEARNING_RATES[:6])
    callback = SuccessiveHalving("train_loss", grace_period=1, reduction_factor=2, max_t=2)
    probe = OutcomesAtEpochEnd(callback)
    fit(module, [callback, probe], max_epochs=2, limit_val_batches=0)
    assert probe.ended == [3, 6]  # the first rung's 3 cuts at the end of epoch 0, the 3 completions at epoch 1's
    stopped = [tid for tid, r in module.results.items() if r["status"] == "stopped"]
    assert len(stopped) == 3
    for tid in stopped:  # judged on its last training loss (DigitsMLP logs it per step), as its results keep it
        assert callback.endings[tid].value == module.results[tid]["metrics"]["train_loss"]
        assert len(module.results[tid]["history"]) == 1  # its epoch's history entry is written all the same


def test_with_validation_the_decision_comes_at_validation_end_of_the_same_epoch():
    module = fused(LEARNING_RATES[:4])
    callback = ASHA("val_loss", grace_period=1, reduction_factor=2, max_t=2)
    probe = OutcomesAtEpochEnd(callback)
    fit(module, [callback, probe], max_epochs=2)
    assert probe.ended == [2, 4]


def test_a_budget_counted_in_steps_is_given_in_steps_with_its_unit():
    module = fused(LEARNING_RATES[:3])
    callback = ASHA("val_loss", time_attr="steps", grace_period=3, reduction_factor=2, max_t=6)
    fit(module, [callback], max_epochs=2)  # 3 batches per epoch: rungs at steps 3 and 6
    for tid, result in module.results.items():
        assert result["budget_unit"] == "steps"
        assert result["budget"] == result["steps"] == callback.endings[tid].budget
    assert {r["budget"] for r in module.results.values()} <= {3, 6}
    plain = fused(LEARNING_RATES[:2])
    fit(plain, [], max_epochs=1)
    assert [(r["budget"], r["budget_unit"]) for r in plain.results.values()] == [(1, "epochs"), (1, "epochs")]


def test_each_run_gets_its_view(tmp_path):
    group = ASHA("val_loss", max_t=1)
    fit(fused(LEARNING_RATES[:2]), [group], max_epochs=1)
    assert isinstance(group._view, FusedTrials)
    assert group.status == "running"  # a fused group has no single status: see its results
    single = ASHA("val_loss", max_t=1, storage=str(tmp_path / "rungs.db"), trial_id="only")
    fit(mlp(0.1), [single], max_epochs=1)
    assert isinstance(single._view, ProcessTrial)
    assert (single.status, single.result["budget"], single._view.epochs) == ("completed", 1, 1)


def test_a_callback_used_before_fit_says_so():
    with pytest.raises(RuntimeError, match=r"ASHA: used before Trainer.fit set it up\."):
        ASHA("val_loss")._trials  # noqa: B018
