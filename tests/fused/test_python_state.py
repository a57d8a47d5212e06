"""Python state that a trial's steps and hooks change ends up in each trial's module as if it trained alone.

The modules are written the way Lightning's LightningModule page writes its epoch-end examples (Lightning 2's
replacement for ``*_epoch_end(outputs)``: ``self.training_step_outputs.append(loss)`` in the step,
``torch.stack(...)`` and ``.clear()`` in ``on_train_epoch_end``; the same for validation and test), and the way
everyday code keeps a counter (a warm-up that scales the loss by 0 for the first steps). Each is fused on every
backend and compared with each trial trained alone.
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends import FusionError
from tests.helpers import fit_digits, make_trainer, max_state_difference

BACKENDS = ["vmap", "hfta", "loop", "auto"]
LRS = (0.05, 0.2, 0.5)


class EpochEndOutputs(L.LightningModule):
    """Keeps each step's outputs in lists and reduces them at the epoch's end, as Lightning 2's docs do."""

    def __init__(self, lr: float = 0.05, hidden_dim: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 10))
        self.training_step_outputs: list[torch.Tensor] = []
        self.validation_step_outputs: list[torch.Tensor] = []
        self.test_step_outputs: list[dict[str, torch.Tensor]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.training_step_outputs.append(loss)
        return loss

    def on_train_epoch_end(self) -> None:
        epoch_mean = torch.stack(self.training_step_outputs).mean()
        self.log("training_epoch_mean", epoch_mean)
        self.training_step_outputs.clear()  # free memory

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.validation_step_outputs.append(loss)
        return loss

    def on_validation_epoch_end(self) -> None:
        self.log("validation_epoch_mean", torch.stack(self.validation_step_outputs).mean())
        self.validation_step_outputs.clear()

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        preds = self.net(x).argmax(-1)
        self.test_step_outputs.append({"correct": (preds == y).sum(), "count": len(y)})

    def on_test_epoch_end(self) -> None:
        correct = torch.stack([out["correct"] for out in self.test_step_outputs]).sum()
        count = sum(out["count"] for out in self.test_step_outputs)
        self.log("test_acc", correct / count)
        self.test_step_outputs.clear()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])


class WarmupCounter(L.LightningModule):
    """Counts its steps in Python and scales the loss by 0 for the first ``warmup`` of them; keeps a history."""

    def __init__(self, lr: float = 0.05, hidden_dim: int = 16, warmup: int = 5) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 10))
        self.calls = 0
        self.epoch_weight = 1.0
        self.batch_sizes: list[int] = []
        self.history: dict[str, list[torch.Tensor]] = {"train": []}

    def on_train_epoch_start(self) -> None:
        self.epoch_weight = 1.0 / (1 + self.current_epoch)  # set by a hook, read by the step

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.calls += 1
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.batch_sizes.append(len(x))
        self.history["train"].append(loss.detach())
        self.last_loss = loss.detach()  # an attribute the step creates
        scale = 0.0 if self.calls <= self.hparams["warmup"] else self.epoch_weight
        self.log("train_loss", loss)
        return loss * scale

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)


def trials(cls: type[L.LightningModule], **kwargs: Any) -> list[L.LightningModule]:
    modules = []
    for seed, lr in enumerate(LRS):
        torch.manual_seed(seed)
        modules.append(cls(lr=lr, **kwargs))
    return modules


def fit_alone(modules: list[L.LightningModule], test: bool = False, **trainer_kwargs: Any) -> list[dict[str, float]]:
    metrics = []
    for module in modules:
        torch.manual_seed(1234)
        trainer = make_trainer(**trainer_kwargs)
        fit_digits(trainer, module)
        values = {k: float(v) for k, v in trainer.callback_metrics.items()}
        if test:
            values.update(
                {k: float(v) for k, v in trainer.test(module, datamodule=_digits(), verbose=False)[0].items()}
            )
        metrics.append(values)
    return metrics


def _digits() -> L.LightningDataModule:
    from lightning_hydro.demos import DigitsDataModule

    return DigitsDataModule(batch_size=64)


def fit_fused(
    modules: list[L.LightningModule],
    backend: str,
    test: bool = False,
    deterministic: bool = False,
    **trainer_kwargs: Any,
) -> Any:
    fused = FusedLightningModule(modules, backend=backend, summary=False, deterministic=deterministic)
    torch.manual_seed(1234)
    trainer = make_trainer(**trainer_kwargs)
    fit_digits(trainer, fused)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if test:
        metrics.update({k: float(v) for k, v in trainer.test(fused, datamodule=_digits(), verbose=False)[0].items()})
    return fused, metrics


FIT = dict(max_epochs=2, limit_train_batches=6, limit_val_batches=2, num_sanity_val_steps=2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_outputs_lists_of_lightnings_docs_give_each_trial_its_own_epoch_values(backend):
    alone = trials(EpochEndOutputs)
    expected = fit_alone([copy.deepcopy(m) for m in alone], test=True, **FIT)
    fused, metrics = fit_fused(alone, backend, test=True, **FIT)
    for tid, values in enumerate(expected):
        for name in ("training_epoch_mean", "validation_epoch_mean", "test_acc"):
            assert metrics[f"{name}/trial_{tid}"] == pytest.approx(values[name], rel=1e-5), (tid, name)
        module = fused.trial_module(tid)
        assert module.training_step_outputs == module.validation_step_outputs == module.test_step_outputs == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_step_counter_and_what_the_step_keeps_end_up_in_each_trial_as_alone(backend):
    alone = trials(WarmupCounter)
    separate = [copy.deepcopy(m) for m in alone]
    expected = fit_alone(separate, **FIT)
    fused, metrics = fit_fused(alone, backend, **FIT)
    for tid, (own, values) in enumerate(zip(separate, expected)):
        module = fused.trial_module(tid)
        assert module.calls == own.calls == 12  # not one more for auto's timing runs or the first-batch check
        assert module.batch_sizes == own.batch_sizes
        assert module.epoch_weight == own.epoch_weight == 0.5
        assert len(module.history["train"]) == 12
        torch.testing.assert_close(torch.stack(module.history["train"]), torch.stack(own.history["train"]))
        torch.testing.assert_close(module.last_loss, own.last_loss)
        assert metrics[f"val_loss/trial_{tid}"] == pytest.approx(values["val_loss"], rel=1e-5)
        assert max_state_difference(fused.unfuse(tid), own) < 1e-5


class DivergingFlag(WarmupCounter):
    """A hook sets a flag from the trial's own hyperparameter; the step branches on it (Python, per trial)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(warmup=0, **kwargs)
        self.boost = False

    def on_train_epoch_end(self) -> None:
        self.boost = self.hparams["lr"] > 0.1

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("boost", self.boost)  # logging a value that differs is fine: each trial logs its own
        if self.boost:
            loss = loss * 2
        return loss


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_state_that_comes_to_differ_between_trials_is_refused_with_its_name_and_line(backend):
    fused = FusedLightningModule(trials(DivergingFlag), backend=backend, summary=False)
    with pytest.raises(
        FusionError,
        match=rf"backend='{backend}' cannot run DivergingFlag.training_step as each trial would run it alone: it "
        r"uses self.boost \(trial 0: False, trial 1: True, trial 2: True\), which differs between trials, at "
        r".*test_python_state.py:\d+ in training_step: if self.boost:",
    ):
        fit_digits(make_trainer(**FIT), fused)


def test_auto_runs_state_that_comes_to_differ_on_the_loop_as_alone():
    alone = trials(DivergingFlag)
    separate = [copy.deepcopy(m) for m in alone]
    expected = fit_alone(separate, **FIT)
    # deterministic: auto takes hfta (the first that runs the first batch), not whatever timing favours
    with pytest.warns(UserWarning, match=r"backend='auto' runs the group on 'loop' from now on: .*self.boost"):
        fused, metrics = fit_fused(alone, "auto", deterministic=True, **FIT)
    assert fused.backend == "loop"
    assert {result["backend"] for result in fused.results.values()} == {"loop"}
    # the report says what runs now, and what auto had chosen first (before, it still said "chose 'hfta'")
    assert re.match(
        r"FusedLightningModule: backend='auto' runs the group on 'loop' from now on: .*self\.boost.*"
        r"\(first: backend='auto' \(deterministic\) chose 'hfta'",
        fused.backend_report,
        re.S,
    )
    for tid, (own, values) in enumerate(zip(separate, expected)):
        assert fused.results[tid]["metrics"]["boost"] == values["boost"] == float(own.boost)
        assert fused.trial_module(tid).boost == own.boost
        assert fused.trial_module(tid).calls == own.calls
        assert metrics[f"val_loss/trial_{tid}"] == pytest.approx(values["val_loss"], rel=1e-5)


def test_with_compile_a_step_that_changes_python_state_runs_eagerly_and_says_so(caplog):
    alone = trials(WarmupCounter)
    separate = [copy.deepcopy(m) for m in alone]
    fit_alone(separate, **FIT)
    fused = FusedLightningModule(alone, backend="vmap", compile=True, summary=False)
    with caplog.at_level(logging.WARNING, logger="lightning_hydro"):
        fit_digits(make_trainer(**FIT), fused)
    lines = [r.getMessage() for r in caplog.records if "falls back to eager" in r.getMessage()]
    assert lines == [
        "lightning_hydro: compile=True falls back to eager for backend='vmap', WarmupCounter.training_step: the step "
        "changes Python state (calls, batch_sizes.append, [...].append, last_loss), which runs per "
        "trial eagerly."
    ]
    assert [fused.trial_module(tid).calls for tid in range(3)] == [own.calls for own in separate]


class Refill(L.Callback):
    """Stops trial 1 after the third batch and puts a fresh trial into its slot (as ASHA's refills do)."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.current_epoch == 0 and batch_idx == 2:
            pl_module.stop_trial(1, "stopped for a newcomer")
            torch.manual_seed(7)
            pl_module.add_trial(EpochEndOutputs(lr=0.1), trial_id=7)


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_a_newcomer_with_an_empty_outputs_list_joins_trials_whose_lists_are_filling(backend):
    def fit(backend: str) -> dict[str, float]:
        _, metrics = fit_fused(trials(EpochEndOutputs), backend, callbacks=[Refill()], **FIT)
        return metrics

    expected = fit("loop")  # each trial's own code on its own list
    metrics = fit(backend)
    for tid in (0, 2, 7):
        for name in ("training_epoch_mean", "validation_epoch_mean"):
            key = f"{name}/trial_{tid}"
            assert metrics[key] == pytest.approx(expected[key], rel=1e-5), key


class StopWithinTheEpoch(L.Callback):
    """Stops trial 1 after the third batch of the first epoch, with no newcomer: the group shrinks."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.current_epoch == 0 and batch_idx == 2:
            pl_module.stop_trial(1, "stopped within the epoch")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_trial_stopped_while_the_outputs_lists_hold_each_steps_graph_leaves_the_others_as_alone(backend):
    # the lists keep each step's loss, with its autograd graph, to the epoch's end: the graphs made for three rows
    # were alive when the group shrank to two (the next backward failed on the old shape, on every backend)
    alone = trials(EpochEndOutputs)
    separate = [copy.deepcopy(m) for m in alone]
    expected = fit_alone(separate, **FIT)
    stopped = copy.deepcopy(alone[1])
    stopped_metrics = fit_alone([stopped], **{**FIT, "max_steps": 3})[0]
    fused, metrics = fit_fused(alone, backend, callbacks=[StopWithinTheEpoch()], **FIT)
    assert fused.results[1]["steps"] == 3
    assert max_state_difference(fused.unfuse(1), stopped) <= 1e-5
    # its list let go of the group's graphs when it left, and its own on_train_epoch_end reduced and cleared it at
    # the epoch's end, as alone (a stop ends a trial's epoch there, as trainer.should_stop ends a run's)
    assert fused.trial_module(1).training_step_outputs == []
    key = "training_epoch_mean"
    assert metrics[f"{key}/trial_1"] == pytest.approx(stopped_metrics[key], rel=1e-5)
    for tid in (0, 2):
        assert max_state_difference(fused.unfuse(tid), separate[tid]) <= 1e-5, tid
        for name in ("training_epoch_mean", "validation_epoch_mean"):
            assert metrics[f"{name}/trial_{tid}"] == pytest.approx(expected[tid][name], rel=1e-5), (tid, name)
