"""The trials' batch-transfer hooks (``on_before_batch_transfer``, ``transfer_batch_to_device``, ``on_after_...``).

Lightning's docs show these hooks normalising or augmenting a batch on the device, and moving a batch of a custom
type. Before, a fused group did not have them: Lightning called its own defaults, and every trial trained and was
validated on the raw batch, silently (weights 0.27 relative from alone, a trial's val_acc 0.109 against 0.170).
Now each trial trains as alone; a hook that would give each trial another batch is refused.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends.errors import FusionError
from lightning_hydro.demos import DigitsMLP, load_digits_tensors
from tests.helpers import fit_digits, make_trainer, max_state_difference, seeded, train_fused, train_separately

FIT = dict(max_epochs=2, limit_train_batches=4, limit_val_batches=2)


class NormalisingMLP(DigitsMLP):
    """Normalises each batch on the device, as Lightning's docs show (training and validation batches alike)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        x, y = batch
        return (x - 0.3) / 0.45, y


@dataclass
class DigitsBatch:
    """A batch of a custom type, which Lightning's default transfer does not know."""

    features: torch.Tensor
    labels: torch.Tensor


def _collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> DigitsBatch:
    xs, ys = zip(*samples)
    return DigitsBatch(torch.stack(xs), torch.stack(ys))


class CustomBatchMLP(DigitsMLP):
    """Moves its custom batches itself and counts the batches it has seen in Python state."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.batches_seen = 0

    def on_before_batch_transfer(self, batch: DigitsBatch, dataloader_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.batches_seen += 1
        return batch.features * 2.0, batch.labels

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        x, y = batch
        return x.to(device), y.to(device)

    def train_dataloader(self) -> DataLoader:
        data, _ = load_digits_tensors()
        return DataLoader(data, batch_size=64, collate_fn=_collate)

    def val_dataloader(self) -> DataLoader:
        _, data = load_digits_tensors()
        return DataLoader(data, batch_size=256, collate_fn=_collate)


class ScaledInputMLP(DigitsMLP):
    """Scales its input by a hyperparameter in the hook: each trial would need a batch of its own."""

    def __init__(self, input_scale: float = 1.0, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.save_hyperparameters()

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        x, y = batch
        return x * self.hparams["input_scale"], y


class DictCountingMLP(DigitsMLP):
    """Counts its batches per stage in a dict (a store into a container the module holds)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.seen = {"train": 0, "val": 0}

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.seen["train" if self.trainer.training else "val"] += 1
        return batch


class NoisyCountingMLP(DigitsMLP):
    """Counts its batches and adds random noise to them: a hook run per trial that draws random numbers."""

    def __init__(self, input_scale: float = 1.0, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.save_hyperparameters()
        self.batches_seen = 0

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.batches_seen += 1
        x, y = batch
        return x * self.hparams["input_scale"] + 0.05 * torch.randn_like(x), y


class Refill(L.Callback):
    """Stops trial 1 after the second step and puts a new trial (id 3) in its slot."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        if trainer.global_step == 2 and 1 in pl_module.trial_ids:
            pl_module.stop_trial(1, "test")
            torch.manual_seed(7)
            pl_module.add_trial(NoisyCountingMLP(lr=0.07), trial_id=3)


def _trials(cls: type, **per_trial: list[Any]) -> list[DigitsMLP]:
    configs = iter([dict(lr=lr, **{k: v[i] for k, v in per_trial.items()}) for i, lr in enumerate([0.05, 0.1, 0.2])])
    return seeded(lambda: cls(**next(configs)), [0, 1, 2])


def _own_fit(trainer: Any, module: Any) -> None:
    trainer.fit(module)


def _validation_losses(fused: FusedLightningModule) -> dict[int, float]:
    return {tid: record["metrics"]["val_loss"] for tid, record in fused.results.items()}


@pytest.mark.parametrize("backend", ["loop", "vmap", "hfta", "auto"])
def test_a_normalising_hook_trains_and_validates_each_trial_as_alone(backend: str) -> None:
    trials = _trials(NormalisingMLP)
    alone = train_separately(trials, fit_digits, **FIT)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": backend}, **FIT)
    tolerance = 0.0 if fused.backend == "loop" else 1e-6
    losses = _validation_losses(fused)
    for row, own in enumerate(alone):
        assert max_state_difference(fused.unfuse(row), own) <= tolerance
        assert losses[row] == pytest.approx(float(own.trainer.callback_metrics["val_loss"]), rel=1e-5)


@pytest.mark.parametrize("backend", ["loop", "vmap"])
def test_a_custom_batch_hook_with_python_state_runs_for_each_trial(backend: str) -> None:
    trials = _trials(CustomBatchMLP)
    alone = train_separately(trials, _own_fit, **FIT)
    fused = train_fused(trials, _own_fit, fused_kwargs={"backend": backend}, **FIT)
    tolerance = 0.0 if backend == "loop" else 1e-6
    for row, own in enumerate(alone):
        assert max_state_difference(fused.unfuse(row), own) <= tolerance
        assert fused.trial_module(row).batches_seen == own.batches_seen == 8 + 4  # 2 epochs x (4 train + 2 val)


@pytest.mark.parametrize("backend", ["loop", "vmap", "auto"])
def test_a_hook_reading_a_per_trial_value_is_refused(backend: str) -> None:
    fused = FusedLightningModule(_trials(ScaledInputMLP, input_scale=[1.0, 2.0, 0.5]), backend=backend, summary=False)
    with pytest.raises(FusionError, match=r"on_after_batch_transfer reads .*hparams.input_scale.*training_step"):
        fit_digits(make_trainer(**FIT), fused)


@pytest.mark.parametrize("backend", ["loop", "vmap"])
def test_a_hook_counting_into_a_dict_runs_for_each_trial(backend: str) -> None:
    trials = _trials(DictCountingMLP)
    alone = train_separately(trials, fit_digits, **FIT)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": backend}, **FIT)
    tolerance = 0.0 if backend == "loop" else 1e-6
    for row, own in enumerate(alone):
        assert max_state_difference(fused.unfuse(row), own) <= tolerance
        assert fused.trial_module(row).seen == own.seen == {"train": 8, "val": 4}


@pytest.mark.parametrize("backend", ["loop", "vmap", "hfta", "auto"])
def test_a_hook_run_per_trial_draws_its_noise_as_alone(backend: str) -> None:
    trials = _trials(NoisyCountingMLP)
    alone = train_separately(trials, fit_digits, **FIT)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": backend}, **FIT)
    tolerance = 0.0 if fused.backend == "loop" else 1e-6
    for row, own in enumerate(alone):
        assert max_state_difference(fused.unfuse(row), own) <= tolerance
        assert fused.trial_module(row).batches_seen == own.batches_seen == 8 + 4


@pytest.mark.parametrize("backend", ["loop", "vmap"])
def test_a_hook_run_per_trial_keeps_running_after_a_trial_is_replaced(backend: str) -> None:
    fused = FusedLightningModule(_trials(NoisyCountingMLP), backend=backend, summary=False)
    fit_digits(make_trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=1, callbacks=[Refill()]), fused)
    assert {tid: fused.trial_module(tid).batches_seen for tid in fused.trial_ids} == {0: 4 + 1, 3: 2 + 1, 2: 4 + 1}


@pytest.mark.parametrize("backend", ["loop", "vmap"])
def test_a_hook_run_per_trial_that_gives_the_trials_other_batches_is_refused(backend: str) -> None:
    trials = _trials(NoisyCountingMLP, input_scale=[1.0, 1.0, 0.5])
    fused = FusedLightningModule(trials, backend=backend, summary=False)
    with pytest.raises(
        FusionError,
        match=r"NoisyCountingMLP.on_after_batch_transfer gives trial 2 another batch than trial 0 \(batch\[0\]: "
        r"tensor values differ\).*training_step",
    ):
        fit_digits(make_trainer(**FIT), fused)


def test_a_group_with_the_hooks_pickles_and_copies() -> None:  # (ddp_spawn pickles the module)
    fused = FusedLightningModule(_trials(NormalisingMLP), summary=False)
    for copied in (pickle.loads(pickle.dumps(fused)), copy.deepcopy(fused)):
        assert copied.on_after_batch_transfer.__self__ is copied._batch_transfer


def test_trials_without_the_hooks_leave_them_to_lightning() -> None:
    fused = FusedLightningModule(_trials(DigitsMLP), summary=False)
    for hook in ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer"):
        assert hook not in vars(fused)  # Lightning's defaults, and no warning beside a DataModule's own hook
