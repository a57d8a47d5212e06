"""A step that changes its batch: every trial, and every run of the first-batch checks, gets the batch as it came.

Code written for one model may change its batch in the step, as the batch is its own: rebind an entry
(``batch["x"] = (batch["x"] - mean) / std``) or write into it (``batch["x"].sub_(mean).div_(std)``). Before, a fused
group handed the one batch to every run: on the loop each later trial normalised the batch the trials before it had
normalised (trials 0.08 and 0.39 relative from alone), under vmap and hfta the first-batch check's and auto's timing
runs did (a first loss of 62 against 2.3 alone), and the in-place version crashed the loop's backward.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends.batch_copies import BatchRuns, containers_copied, first_difference, tensors_copied
from lightning_hydro.demos import DigitsMLP, load_digits_tensors
from tests.helpers import make_trainer, max_state_difference

MEAN, STD = 0.3, 0.45
FIT = dict(max_steps=3, val_check_interval=3, limit_val_batches=2)


class DigitsDicts(Dataset):
    """The digits as ``{"x": features, "y": label}`` samples (a loader then gives dicts of batches)."""

    def __init__(self) -> None:
        self.data, _ = load_digits_tensors()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        x, y = self.data[index]
        return {"x": x, "y": y}


class NormalisingMLP(DigitsMLP):
    """Normalises its batch in the step: ``how`` is "rebind" (a new entry) or "in_place" (written into it)."""

    def __init__(self, how: str = "rebind", **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.how = how

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.how == "rebind":
            batch["x"] = (batch["x"] - MEAN) / STD
        else:
            batch["x"].sub_(MEAN).div_(STD)
        return F.cross_entropy(self(batch["x"]), batch["y"])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch))  # (the loop's evaluation batches are inference tensors)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(DigitsDicts(), batch_size=64)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(DigitsDicts(), batch_size=128)


class ScalingTupleMLP(DigitsMLP):
    """A tuple batch whose features the step scales in place."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        x.mul_(2.0)
        return F.cross_entropy(self(x), y)

    def train_dataloader(self) -> DataLoader:
        data, _ = load_digits_tensors()
        return DataLoader(data, batch_size=64)


def _trials(make: Any) -> list[DigitsMLP]:
    trials = []
    for seed, lr in enumerate([0.05, 0.1, 0.2]):
        torch.manual_seed(seed)
        trials.append(make(lr))
    return trials


def _alone(trials: list[DigitsMLP]) -> list[DigitsMLP]:
    runs = []
    for trial in trials:
        alone = copy.deepcopy(trial)
        torch.manual_seed(1234)
        make_trainer(**FIT).fit(alone)
        runs.append(alone)
    return runs


MODELS = {
    "rebind": lambda lr: NormalisingMLP("rebind", lr=lr),
    "in_place": lambda lr: NormalisingMLP("in_place", lr=lr),
    "tuple_in_place": lambda lr: ScalingTupleMLP(lr=lr),
}


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("backend", ["loop", "vmap", "hfta", "auto"])
def test_a_step_that_changes_its_batch_trains_each_trial_as_alone(model: str, backend: str) -> None:
    trials = _trials(MODELS[model])
    alone = _alone(trials)
    fused = FusedLightningModule([copy.deepcopy(t) for t in trials], backend=backend, summary=False)
    torch.manual_seed(1234)
    make_trainer(**FIT).fit(fused)
    tolerance = 0.0 if fused.backend == "loop" else 1e-6
    for row, own in enumerate(alone):
        assert max_state_difference(fused.unfuse(row), own) <= tolerance, (model, backend, row)
        if model != "tuple_in_place":  # (validated too)
            expected = float(own.trainer.callback_metrics["val_loss"])
            assert fused.results[row]["metrics"]["val_loss"] == pytest.approx(expected, rel=1e-5)


def test_batch_runs_hand_out_the_batch_as_it_came() -> None:
    x, y = torch.arange(4.0), torch.arange(4)
    batch = {"x": x, "y": y, "tags": ["a", "b"]}
    runs = BatchRuns((batch, 0), runs=3)
    first, _ = runs.next()
    assert first is not batch  # new containers
    assert first["x"] is x  # the loader's tensors
    first["x"] = first["x"] * 10  # a rebound entry stays in the run's own dict
    second, _ = runs.next()
    assert second["x"] is x
    assert batch["x"] is x
    second["x"].add_(1)  # written into the loader's tensor: the next run gets a copy as it came
    third, _ = runs.next()
    assert third["x"] is not x
    assert torch.equal(third["x"], torch.arange(4.0))
    assert third["tags"] == ["a", "b"]
    assert third["tags"] is not batch["tags"]


def test_copies_keep_the_containers_kinds() -> None:
    x = torch.ones(2)
    batch = ([x, {"a": x}], (x, 3, "s"), None)
    same = containers_copied(batch)
    assert same == batch
    assert same[0] is not batch[0]
    assert same[0][1] is not batch[0][1]
    assert same[0][0] is x
    cloned = tensors_copied(batch)
    assert cloned[0][0] is not x
    assert torch.equal(cloned[0][0], x)
    assert cloned[1][1:] == (3, "s")


def test_first_difference_names_where_two_batches_differ() -> None:
    x = torch.arange(4.0)
    assert first_difference({"x": x, "tags": ["a"]}, {"x": x.clone(), "tags": ["a"]}) is None
    assert first_difference((x, 1), (x + 1, 1)) == "batch[0]: tensor values differ"
    assert first_difference((x, 1), (x, 2)) == "batch[1]: 1 against 2"
    assert first_difference([x], [x, x]) == "batch: 1 entries against 2"
    assert first_difference({"x": x}, {"y": x}) == "batch: keys ['x'] against ['y']"
    assert first_difference((x,), (x.double(),)) == "batch[0]: dtype torch.float32 against torch.float64"
    assert first_difference((x,), ([x],)) == "batch[0]: a Tensor against a list"


def test_a_step_that_writes_into_its_batch_trains_as_alone_under_compile() -> None:
    # before, the compiled step's first calls ran compiled and then eagerly on the batch the compiled run had written
    # into: the eager run, whose result is kept, scaled the batch twice (a first loss of 2.44 against 2.32 alone, and
    # weights 0.06 to 0.12 relative from alone)
    trials = _trials(MODELS["tuple_in_place"])
    alone = _alone(trials)
    fused = FusedLightningModule([copy.deepcopy(t) for t in trials], backend="vmap", compile=True, summary=False)
    torch.manual_seed(1234)
    make_trainer(**FIT).fit(fused)
    for row, own in enumerate(alone):
        assert max_state_difference(fused.unfuse(row), own) <= 1e-5, row


class BatchEndMLP(DigitsMLP):
    """Changes its batch in the step its own way (by its lr), and records what its batch-end hooks get as ``batch``.

    ``how``: "in_place" scales the features in place, "rebind" rebinds the list's entry (``batch[0] = ...``),
    "manual" does the latter under manual optimization.
    """

    def __init__(self, how: str = "in_place", **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.how = how
        self.automatic_optimization = how != "manual"
        self.seen: list[tuple[str, float]] = []

    def _changed(self, batch: list[torch.Tensor]) -> torch.Tensor:
        if self.how == "in_place":
            batch[0].mul_(10 * self.hparams["lr"])
        else:
            batch[0] = batch[0] * (10 * self.hparams["lr"])
        return F.cross_entropy(self(batch[0]), batch[1])

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        loss = self._changed(batch)
        if self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        optimizer.zero_grad()  # type: ignore[union-attr]
        self.manual_backward(loss)
        optimizer.step()  # type: ignore[union-attr]
        return None

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self._changed(batch))

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seen.append(("train", float(batch[0].sum())))

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.seen.append(("val", float(batch[0].sum())))

    def train_dataloader(self) -> DataLoader:
        data, _ = load_digits_tensors()
        return DataLoader(data, batch_size=64)

    def val_dataloader(self) -> DataLoader:
        _, data = load_digits_tensors()
        return DataLoader(data, batch_size=128)


@pytest.mark.parametrize(
    ("how", "backend"), [("in_place", "loop"), ("in_place", "auto"), ("rebind", "loop"), ("manual", "loop")]
)
def test_each_trials_batch_end_hooks_get_the_batch_its_step_left(how: str, backend: str) -> None:
    # before, every trial's hook got the loader's batch: as trial 0's step wrote it (615.8 where trial 1 alone sees
    # 307.9), and without any trial's rebound entry (3.14 alone, 615.8 fused)
    trials = _trials(lambda lr: BatchEndMLP(how, lr=lr))
    alone = _alone(trials)
    fused = FusedLightningModule([copy.deepcopy(t) for t in trials], backend=backend, summary=False)
    torch.manual_seed(1234)
    make_trainer(**FIT).fit(fused)
    assert fused.backend == "loop"
    for row, own in enumerate(alone):
        assert max_state_difference(fused.unfuse(row), own) == 0.0, row
        assert fused.trial_module(row).seen == own.seen, row
