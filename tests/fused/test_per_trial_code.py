"""The user's own code runs per trial: logging, Trainer properties, data hooks, evaluation, predictions."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from tests.helpers import fit_digits, make_trainer, mixed_optimizer_mlps, train_fused, train_separately


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_logged_metrics_are_per_trial_and_equal_separate_runs(backend):
    trials = mixed_optimizer_mlps()[:3]
    separate = train_separately(trials, fit_digits, max_epochs=2, limit_train_batches=5)
    fused = FusedLightningModule(trials, backend=backend, summary=False)
    trainer = make_trainer(max_epochs=2, limit_train_batches=5)
    fit_digits(trainer, fused)
    for tid, module in enumerate(separate):
        expected = module.trainer.callback_metrics
        for name in ("val_loss", "val_acc"):
            assert trainer.callback_metrics[f"{name}/trial_{tid}"].item() == pytest.approx(
                expected[name].item(), rel=1e-4
            )
            assert fused.results[tid]["metrics"][name] == pytest.approx(expected[name].item(), rel=1e-4)
        # the last step value of a step-level metric, as Lightning keeps it
        assert fused.results[tid]["metrics"]["train_loss"] == pytest.approx(expected["train_loss"].item(), rel=1e-4)
        assert [h["epoch"] for h in fused.results[tid]["history"]] == [0.0, 1.0]
        assert fused.results[tid]["history"][1]["val_acc"] == fused.results[tid]["metrics"]["val_acc"]
    assert fused.results[0]["status"] == "completed"
    assert fused.results[0]["budget"] == 2


class ProbeMLP(DigitsMLP):
    """Records what Trainer-derived properties the user's code sees inside its steps."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple[int, int, str, bool]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, self.global_step, self.device.type, self.trainer is not None))
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log_dict({"train_loss": loss, "lr_seen": float(self.hparams["lr"])})
        return loss


def test_trainer_properties_inside_the_users_steps():
    trials = [ProbeMLP(hidden_dim=8, lr=0.1), ProbeMLP(hidden_dim=8, lr=0.2)]
    fused = FusedLightningModule(trials, backend="loop", summary=False)
    fit_digits(make_trainer(max_epochs=2, limit_train_batches=3, limit_val_batches=1), fused)
    assert trials[1].seen == [
        (0, 0, "cpu", True),
        (0, 1, "cpu", True),
        (0, 2, "cpu", True),
        (1, 3, "cpu", True),
        (1, 4, "cpu", True),
        (1, 5, "cpu", True),
    ]
    # log_dict works per trial, with each trial's own python value under the loop backend
    assert fused.results[0]["metrics"]["lr_seen"] == pytest.approx(0.1)
    assert fused.results[1]["metrics"]["lr_seen"] == pytest.approx(0.2)


def test_without_a_datamodule_the_first_trials_data_hooks_feed_the_group():
    trials = [BoringModel(), BoringModel()]
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    make_trainer(max_steps=4, limit_val_batches=2).fit(fused)  # BoringModel brings its own dataloaders
    assert fused.results[1]["steps"] == 4


class MLPWithTestStep(DigitsMLP):
    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_acc", (self(x).argmax(-1) == y).float().mean())


def test_a_hook_the_trials_lack_is_missing_from_the_fused_module_too():
    fused = FusedLightningModule([DigitsMLP(), DigitsMLP()], backend="vmap", summary=False)
    with pytest.raises(Exception, match=r"No `test_step\(\)` method defined to run `Trainer.test`"):
        make_trainer().test(fused, datamodule=DigitsDataModule())


def test_validate_test_and_predict_run_per_trial():
    trials = [MLPWithTestStep(hidden_dim=16, lr=lr) for lr in (0.1, 0.3)]
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    trainer = make_trainer(max_epochs=1)
    dm = DigitsDataModule()
    trainer.fit(fused, datamodule=dm)
    metrics = trainer.validate(fused, datamodule=dm, verbose=False)[0]
    assert set(metrics) == {"val_loss/trial_0", "val_acc/trial_0", "val_loss/trial_1", "val_acc/trial_1"}
    test_metrics = trainer.test(fused, datamodule=dm, verbose=False)[0]
    assert test_metrics["test_acc/trial_1"] == pytest.approx(metrics["val_acc/trial_1"])  # same data
    assert fused.results[1]["metrics"]["test_acc"] == pytest.approx(metrics["val_acc/trial_1"])
    x = torch.randn(5, 64)
    stacked = fused(x)
    assert stacked.shape == (2, 5, 10)
    assert torch.allclose(stacked[1], fused.unfuse(1)(x), atol=1e-6)


def test_predict_returns_each_trials_output_by_id():
    trials = [BoringModel(), BoringModel()]
    fused = FusedLightningModule(trials, backend="vmap", trial_ids=[7, 9], summary=False)
    batch = torch.randn(4, 32)
    loader = torch.utils.data.DataLoader(batch, batch_size=4)  # batches are plain tensors
    predictions = make_trainer().predict(fused, dataloaders=loader)  # LightningModule default predict_step
    assert set(predictions[0]) == {7, 9}
    assert torch.allclose(predictions[0][9], fused.unfuse(9)(batch), atol=1e-6)


def test_summary_table_is_printed_at_the_end_of_fit(capsys):
    trials = mixed_optimizer_mlps()[:2]
    fused = FusedLightningModule(trials, backend="vmap", monitor="val_acc", mode="max")
    fit_digits(make_trainer(max_epochs=1), fused)
    out = capsys.readouterr().out
    assert "trial  status     epochs  steps  val_acc" in out
    assert "best" in out


def test_progress_bar_shows_running_trials():
    trials = mixed_optimizer_mlps()[:2]
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    trainer = make_trainer(max_steps=3, enable_progress_bar=True, limit_val_batches=0)
    fit_digits(trainer, fused)
    assert trainer.progress_bar_metrics["trials"] == 2.0


def test_per_trial_step_values_reach_the_logger(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    trials = mixed_optimizer_mlps()[:2]
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    logger = CSVLogger(tmp_path, name="run")
    fit_digits(make_trainer(max_epochs=1, logger=logger, log_every_n_steps=5), fused)
    text = (tmp_path / "run" / "version_0" / "metrics.csv").read_text()
    header = text.splitlines()[0].split(",")
    assert {"train_loss/trial_0", "train_loss/trial_1", "val_acc/trial_0", "val_acc/trial_1"} <= set(header)


def test_separately_trained_and_fused_share_nothing_after_unfuse():
    trials = mixed_optimizer_mlps()[:2]
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "vmap"}, max_steps=2)
    standalone = fused.unfuse(0)
    trainer = make_trainer(max_steps=2)
    fit_digits(trainer, standalone)  # trains on its own, as an ordinary LightningModule
    assert trainer.global_step == 2
