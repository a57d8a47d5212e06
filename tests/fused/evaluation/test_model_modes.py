"""A trial's own ``on_{validation,test,predict}_model_eval`` / ``on_*_model_train`` set its modes, as alone.

Lightning calls the module's ``on_validation_model_eval`` before validation (by default ``eval()``) and, where it is
overridden, ``on_validation_model_train`` after it (else it restores the recorded modes). A fused group called
neither of the trials' overrides before: a trial keeping BatchNorm on batch statistics during validation was
validated in eval mode (val_loss 2.13 against 1.74 alone).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_hydro.demos import DigitsDataModule
from tests.helpers import fit_digits, make_trainer, max_state_difference, train_fused, train_separately

RUN = dict(max_epochs=2, limit_train_batches=3, limit_val_batches=2, num_sanity_val_steps=1)


class BatchStatsInEvaluation(L.LightningModule):
    """Evaluates with BatchNorm on the batch's statistics (its running statistics keep moving), then trains on."""

    def __init__(self, lr: float, batch_stats: bool = True) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU())
        self.head = nn.Linear(16, 10)
        self.calls: list[tuple[str, bool, bool]] = []  # (hook, module's mode, BatchNorm's mode) after the hook

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", F.cross_entropy(self(x), y))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])

    def _eval(self, hook: str) -> None:
        self.eval()
        self.body[1].train(self.hparams["batch_stats"])
        self.calls.append((hook, self.training, self.body[1].training))

    def _train(self, hook: str) -> None:
        self.train()
        self.calls.append((hook, self.training, self.body[1].training))

    def on_validation_model_eval(self) -> None:
        self._eval("on_validation_model_eval")

    def on_validation_model_train(self) -> None:
        self._train("on_validation_model_train")

    def on_test_model_eval(self) -> None:
        self._eval("on_test_model_eval")

    def on_test_model_train(self) -> None:
        self._train("on_test_model_train")

    def on_predict_model_eval(self) -> None:
        self._eval("on_predict_model_eval")


def trials(*batch_stats: bool) -> list[BatchStatsInEvaluation]:
    modules = []
    for seed, (lr, stats) in enumerate(zip((0.05, 0.2, 0.1), batch_stats)):
        torch.manual_seed(seed)
        modules.append(BatchStatsInEvaluation(lr, stats))
    return modules


def evaluate(module: L.LightningModule) -> tuple[dict[str, float], Any]:
    """Test, then predict: the test's values and the predictions."""
    trainer = make_trainer(limit_test_batches=2, limit_predict_batches=2)
    data = DigitsDataModule()
    trainer.test(module, datamodule=data, verbose=False)
    tested = {name: float(value) for name, value in trainer.callback_metrics.items()}
    data.setup()
    assert data.val_set is not None
    loader = torch.utils.data.DataLoader(data.val_set, batch_size=64)
    return tested, trainer.predict(module, dataloaders=loader)


def check_each_trial_as_alone(modules: list[BatchStatsInEvaluation], backend: str, tolerance: float) -> None:
    alone = train_separately(modules, fit_digits, **RUN)
    fused = train_fused(modules, fit_digits, fused_kwargs=dict(backend=backend), **RUN)
    fit_values = {name: float(value) for name, value in fused.trainer.callback_metrics.items()}
    for tid, single in enumerate(alone):
        # each hook ran for the trial, as often and with the modes it set alone (the sanity check's included)
        assert fused.trial_module(tid).calls == single.calls
        assert max_state_difference(fused.unfuse(tid), single) <= tolerance  # the running statistics too
        assert fit_values[f"val_loss/trial_{tid}"] == pytest.approx(float(single.trainer.callback_metrics["val_loss"]))
    tested, predicted = evaluate(fused)
    for tid, single in enumerate(alone):
        trial = fused.trial_module(tid)
        single_tested, single_predicted = evaluate(single)
        assert trial.calls == single.calls
        assert tested[f"test_loss/trial_{tid}"] == pytest.approx(single_tested["test_loss"], rel=1e-5)
        for batch, single_batch in zip(predicted, single_predicted):
            torch.testing.assert_close(batch[tid], single_batch, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("backend", "tolerance"), [("loop", 0.0), ("vmap", 1e-5), ("hfta", 1e-5)])
def test_the_trials_own_model_mode_hooks_run_as_alone(backend: str, tolerance: float) -> None:
    check_each_trial_as_alone(trials(True, True, True), backend, tolerance)


def test_modes_that_differ_between_trials_evaluate_per_trial_on_the_loop() -> None:
    # one template runs every trial's step under vmap: with trial-dependent modes it would stand for all
    modules = trials(True, False, True)
    with pytest.warns(UserWarning, match=r"the trials' on_validation_model_eval left .* in different modes"):
        check_each_trial_as_alone(modules, "vmap", 1e-5)
