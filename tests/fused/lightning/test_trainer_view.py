"""A fused trial's ``self.trainer`` behaves as the Trainer of its unfused run."""

from __future__ import annotations

import functools
from typing import Any

import lightning as L
import pytest
import torch

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from lightning_hydro.demos.template_mnist import DigitsMNISTDataModule, MNISTLitModule, SimpleDenseNet
from lightning_hydro.fused.lightning.trainer_view import TrialTrainerView, trial_metrics_view
from tests.helpers import fit_digits, make_trainer, train_fused, train_separately


def template_module(lr: float, seed: int = 0, scheduler: bool = True) -> MNISTLitModule:
    torch.manual_seed(seed)
    return MNISTLitModule(
        net=SimpleDenseNet(lin1_size=32, lin2_size=32, lin3_size=16),
        optimizer=functools.partial(torch.optim.Adam, lr=lr),
        scheduler=functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, mode="min", patience=2)
        if scheduler
        else None,
    )


def test_the_view_answers_model_and_metrics_for_its_trial_and_forwards_the_rest() -> None:
    trainer = make_trainer(max_epochs=3)
    trial = L.LightningModule()
    view = TrialTrainerView(trainer, trial, trial_id=2)
    assert view.model is trial
    assert view.lightning_module is trial
    assert view.trainer is trainer
    assert view.max_epochs == 3
    assert view.trial_id == 2
    trainer.callback_metrics.update({"val/acc/trial_2": torch.tensor(0.5), "val/acc/trial_12": torch.tensor(0.1)})
    assert trial_metrics_view(trainer.callback_metrics, 2) == {"val/acc": torch.tensor(0.5)}
    assert set(view.callback_metrics) == {"val/acc"}
    view.should_stop = True  # writes reach the real Trainer
    assert trainer.should_stop
    with pytest.raises(AttributeError, match="'model' is read-only"):
        view.model = trial  # type: ignore[misc]


def test_the_template_module_fuses_unchanged_with_its_trainer_model_optimizer() -> None:
    """lightning-hydra-template builds its optimizer from self.trainer.model.parameters(); each trial gets its own."""
    trials = [template_module(lr, seed=s) for s, lr in enumerate((1e-3, 3e-3))]
    fused = FusedLightningModule(trials, backend="loop", summary=False)
    trainer = make_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    trainer.fit(fused, datamodule=DigitsMNISTDataModule(batch_size=64))
    assert fused._optimizer is not None
    for tid, module in zip(fused.trial_ids, trials):
        optimizer = fused._optimizer.trials[tid].optimizer
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        assert held == {id(p) for p in module.parameters()}
        assert module.trainer.model is module
        assert module.trainer.lightning_module is module
    assert {"val/acc/trial_0", "val/acc/trial_1"} <= set(trainer.callback_metrics)


class _ReadsItsTrainer(L.LightningModule):
    """A module whose hooks read self.trainer as an unfused module would."""

    def __init__(self, lr: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(4, 1)
        self.seen: list[dict[str, Any]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean() * self.hparams["lr"]

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.layer(batch[0]).pow(2).mean() * self.hparams["lr"])

    def on_train_epoch_end(self) -> None:
        self.seen.append(
            {
                "model": self.trainer.model,
                "lightning_module": self.trainer.lightning_module,
                "metrics": dict(self.trainer.callback_metrics),
                "epoch": self.trainer.current_epoch,
            }
        )

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.trainer.model.parameters(), lr=self.hparams["lr"])


def test_hooks_of_a_trial_see_their_own_module_and_their_own_metrics() -> None:
    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trials = [_ReadsItsTrainer(lr) for lr in (1.0, 2.0)]
    fused = FusedLightningModule(trials, backend="loop", summary=False)
    make_trainer(max_epochs=2).fit(fused, train_dataloaders=loader, val_dataloaders=loader)
    for module in trials:
        assert [seen["epoch"] for seen in module.seen] == [0, 1]
        assert all(seen["model"] is module and seen["lightning_module"] is module for seen in module.seen)
        assert set(module.seen[1]["metrics"]) == {"val_loss"}  # epoch 0's validation, under the unfused name
    first, second = (float(m.seen[1]["metrics"]["val_loss"]) for m in trials)
    assert first != second


def test_a_view_can_be_copied_without_recursing_into_the_trainer() -> None:
    import copy

    trainer = make_trainer()
    view = TrialTrainerView(trainer, L.LightningModule(), trial_id=0)
    assert copy.copy(view).trial_id == 0


class _ReadsEpochValues(DigitsMLP):
    """Reads what Lightning holds for this epoch in its epoch-end hooks (a schedule or a print keyed on it)."""

    def __init__(self, lr: float) -> None:
        super().__init__(hidden_dim=8, lr=lr)
        self.seen: list[tuple[str, dict[str, float], dict[str, float]]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        self.log("loss", loss, on_step=True, on_epoch=True)
        self.log("acc", (logits.argmax(-1) == y).float().mean(), on_step=False, on_epoch=True)
        return loss

    def _read(self, hook: str) -> None:
        callback, logged = self.trainer.callback_metrics, self.trainer.logged_metrics
        self.seen.append(
            (
                hook,
                {name: float(value) for name, value in callback.items()},
                {name: float(logged[name]) for name in ("loss_epoch", "acc", "val_loss") if name in logged},
            )
        )

    def on_train_epoch_end(self) -> None:
        self._read("on_train_epoch_end")
        self.trainer.callback_metrics["loss_epoch"]  # indexed, as in the user's code: a KeyError before

    def on_validation_epoch_end(self) -> None:
        self._read("on_validation_epoch_end")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y))

    def on_test_epoch_end(self) -> None:
        self._read("on_test_epoch_end")


@pytest.mark.parametrize("backend", ["loop", "vmap"])
def test_epoch_end_hooks_see_their_own_values_of_this_epoch_as_alone(backend: str) -> None:
    # alone, Lightning reduces the epoch's logged values into callback_metrics and logged_metrics before the module's
    # on_train_epoch_end / on_validation_epoch_end (the sanity check's included) / on_test_epoch_end; before, a fused
    # trial saw the previous epoch's (a KeyError in epoch 0)
    trials = []
    for seed, lr in enumerate((0.05, 0.2)):
        torch.manual_seed(seed)
        trials.append(_ReadsEpochValues(lr))
    run = dict(max_epochs=2, limit_train_batches=3, limit_val_batches=2, num_sanity_val_steps=1)
    alone = train_separately(trials, fit_digits, **run)
    fused = train_fused(trials, fit_digits, fused_kwargs=dict(backend=backend), **run)
    for module in [*alone, fused]:
        make_trainer(limit_test_batches=2).test(module, datamodule=DigitsDataModule(), verbose=False)
    for tid, single in enumerate(alone):
        seen = fused.trial_module(tid).seen
        assert [hook for hook, _, _ in seen] == [hook for hook, _, _ in single.seen]
        assert seen[-1][0] == "on_test_epoch_end"
        for (hook, callback, logged), (_, callback_alone, logged_alone) in zip(seen, single.seen):
            assert callback.keys() == callback_alone.keys(), hook
            assert logged.keys() == logged_alone.keys(), hook
            for name in callback_alone:
                assert callback[name] == pytest.approx(callback_alone[name], rel=1e-6, abs=1e-7), (hook, name)
            for name in logged_alone:
                assert logged[name] == pytest.approx(logged_alone[name], rel=1e-6, abs=1e-7), (hook, name)
