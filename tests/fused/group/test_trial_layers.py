"""Layers a trial gets after its ``__init__``: fused as alone, or refused with the cause and the remedy.

A fused group stacks the trials' parameters when it is built. Before: an unmaterialised ``nn.LazyLinear`` crashed in
the stacking (torch's ``Can't access the shape of an uninitialized parameter``).
"""

from __future__ import annotations

import copy
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from tests.helpers import fit_digits, make_trainer, max_state_difference

LRS = (0.05, 0.2, 0.5)


class DigitsNet(L.LightningModule):
    """The step and optimizer of the modules below; each builds its layers its own way."""

    net: nn.Module

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)


class LazyNet(DigitsNet):
    def __init__(self, lr: float = 0.1, materialise: bool = False) -> None:
        super().__init__(lr)
        self.net = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.LazyLinear(10))
        if materialise:
            self(torch.zeros(1, 64))  # what the refusal advises


def fit(module: L.LightningModule) -> None:
    fit_digits(make_trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=0), module)


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_lazy_layers_not_materialised_are_refused_by_name_with_the_remedy(backend):
    with pytest.raises(
        ValueError,
        match=r"FusedLightningModule: trial 0 \(LazyNet\) has lazy layers that no forward has materialised yet: "
        r"'net.0' \(LazyLinear\), 'net.2' \(LazyLinear\)\. .*Run one forward on each trial before fusing it",
    ):
        FusedLightningModule([LazyNet(lr) for lr in LRS], backend=backend)


def test_a_lazy_newcomer_is_refused_by_add_trial():
    fused = FusedLightningModule([LazyNet(0.1, materialise=True)], max_slots=2, summary=False)
    with pytest.raises(ValueError, match=r"add_trial: trial 1 \(LazyNet\) has lazy layers .*'net.0' \(LazyLinear\)"):
        fused.add_trial(LazyNet(0.2))
    assert fused.trial_ids == [0]


def test_lazy_layers_materialised_by_one_forward_fuse_as_alone():
    trials = []
    for seed, lr in enumerate(LRS):
        torch.manual_seed(seed)
        trials.append(LazyNet(lr, materialise=True))
    alone = copy.deepcopy(trials)
    fused = FusedLightningModule(trials, backend="loop", summary=False)
    fit(fused)
    for index, module in enumerate(alone):
        fit(module)
        assert max_state_difference(fused.unfuse(index), module) == 0.0


def test_modules_without_lazy_layers_pass():
    FusedLightningModule([DigitsMLP(hidden_dim=8), DigitsMLP(hidden_dim=8)])


class BuiltInConfigureModel(DigitsNet):
    """Every layer built in ``configure_model``, idempotent as Lightning asks (it calls it at every stage)."""

    def configure_model(self) -> None:
        if not hasattr(self, "net"):
            self.net = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


class HeadInConfigureModel(DigitsNet):
    """The body built in ``__init__``, the head in ``configure_model``."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__(lr)
        self.body = nn.Sequential(nn.Linear(64, 16), nn.ReLU())
        self.head: nn.Module | None = None

    def configure_model(self) -> None:
        if self.head is None:
            self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.head is not None
        return self.head(self.body(x))


@pytest.mark.parametrize("backend", ["loop", "vmap"])
@pytest.mark.parametrize("cls", [BuiltInConfigureModel, HeadInConfigureModel])
def test_layers_built_in_configure_model_are_built_with_the_group_and_train_as_alone(cls, backend):
    # before: StopIteration with no message (every layer there), or TypeError: 'NoneType' object is not callable
    fused = FusedLightningModule([cls(lr) for lr in LRS], backend=backend, summary=False)
    # the group called configure_model when it was built: each trial's initial weights, as a module of its own
    start = [fused.unfuse(tid) for tid in fused.trial_ids]
    fit(fused)
    for index, module in enumerate(start):
        fit(module)  # Lightning calls its configure_model again: a no-op, as alone after a first stage
        assert max_state_difference(fused.unfuse(index), module) <= (0.0 if backend == "loop" else 1e-5)


class NeedsTrainerInConfigureModel(BuiltInConfigureModel):
    def configure_model(self) -> None:
        if self.trainer.world_size > 1:  # e.g. to shard; a group calls the hook before there is a Trainer
            raise NotImplementedError
        super().configure_model()


def test_a_configure_model_that_needs_the_trainer_is_explained():
    with pytest.raises(
        RuntimeError,
        match=r"FusedLightningModule: trial 1's configure_model\(\) failed when the group called it to build the "
        r"trial's layers, before any Trainer .*is not attached to a `Trainer`.*Build the layers in __init__",
    ):
        FusedLightningModule([BuiltInConfigureModel(0.1), NeedsTrainerInConfigureModel(0.2)])


def test_a_group_of_configure_model_trials_is_rebuilt_from_its_checkpoint(tmp_path):
    fused = FusedLightningModule([BuiltInConfigureModel(lr) for lr in LRS], backend="loop", summary=False)
    trainer = make_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0)
    fit_digits(trainer, fused)
    trainer.save_checkpoint(tmp_path / "group.ckpt")
    loaded = FusedLightningModule.load_group_checkpoint(tmp_path / "group.ckpt", backend="loop")
    for tid in fused.trial_ids:
        assert max_state_difference(loaded.unfuse(tid), fused.unfuse(tid)) == 0.0


def test_a_configure_model_trial_that_joined_the_run_is_rebuilt_when_the_fit_resumes(tmp_path):
    fused = FusedLightningModule([BuiltInConfigureModel(lr) for lr in LRS[:2]], max_slots=3, summary=False)
    fused.add_trial(BuiltInConfigureModel(LRS[2]))  # not among the trials the resumed group is given
    trainer = make_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0)
    fit_digits(trainer, fused)
    trainer.save_checkpoint(tmp_path / "group.ckpt")
    resumed = FusedLightningModule([BuiltInConfigureModel(lr) for lr in LRS[:2]], max_slots=3, summary=False)
    fit_digits(
        make_trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0),
        resumed,
        ckpt_path=tmp_path / "group.ckpt",
    )
    assert resumed.trial_ids == [0, 1, 2]
    assert resumed.results[2]["epochs"] == 2


class HeadInSetup(DigitsNet):
    """The head built in ``setup``, sized from the data (the number of classes)."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__(lr)
        self.body = nn.Sequential(nn.Linear(64, 16), nn.ReLU())
        self.head: nn.Module | None = None

    def setup(self, stage: str) -> None:
        if self.head is None:
            classes = int(self.trainer.datamodule.train_set.tensors[1].max()) + 1  # type: ignore[attr-defined]
            self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.head is not None
        return self.head(self.body(x))


class HeadReplacedInSetup(HeadInSetup):
    """A head built in ``__init__`` and built again, of the data's size, in ``setup``."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__(lr)
        self.head = nn.Linear(16, 10)
        self.sized = False

    def setup(self, stage: str) -> None:
        if not self.sized:
            self.head, self.sized = None, True
            super().setup(stage)


@pytest.mark.parametrize("backend", ["loop", "vmap", "hfta", "auto"])
def test_a_layer_built_in_setup_is_refused_by_name_with_the_remedy(backend):
    # before: loop/auto trained a head that was not in the stacked state (trials 1 and 2 differed from alone by 1.4);
    # vmap/hfta refused on the first batch with a loss mismatch that did not name the cause
    fused = FusedLightningModule([HeadInSetup(lr) for lr in LRS], backend=backend, summary=False)
    with pytest.raises(
        ValueError,
        match=r"FusedLightningModule: trial 0's setup\('fit'\) gave it parameters the fused group does not hold: "
        r"'head.weight' \(new\), 'head.bias' \(new\)\. .*Build these layers in __init__, e.g. from a size the "
        r"DataModule gives before fusing",
    ):
        fit(fused)


def test_a_layer_rebuilt_in_setup_is_refused_by_name():
    fused = FusedLightningModule([HeadReplacedInSetup(lr) for lr in LRS], backend="loop", summary=False)
    with pytest.raises(
        ValueError,
        match=r"trial 0's setup\('fit'\) gave it parameters .*'head.weight' \(replaced\), 'head.bias' \(replaced\)\.",
    ):
        fit(fused)


class MeanInSetup(DigitsNet):
    """``setup`` computes normalisation statistics from the data: a new buffer, and one registered in ``__init__``."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__(lr)
        self.net = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
        self.register_buffer("scale", torch.ones(64))

    def setup(self, stage: str) -> None:
        x = self.trainer.datamodule.train_set.tensors[0]  # type: ignore[attr-defined]
        self.register_buffer("mean", x.mean(0))
        self.scale = x.std(0) + 1.0  # reassigned: the stacked row must take it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mean) / self.scale)


@pytest.mark.parametrize("backend", ["loop", "vmap"])
def test_buffers_computed_from_the_data_in_setup_train_as_alone(backend):
    trials = []
    for seed, lr in enumerate(LRS):
        torch.manual_seed(seed)
        trials.append(MeanInSetup(lr))
    alone = copy.deepcopy(trials)
    fused = FusedLightningModule(trials, backend=backend, summary=False)
    fit(fused)
    for index, module in enumerate(alone):
        fit(module)
        assert max_state_difference(fused.unfuse(index), module) <= (0.0 if backend == "loop" else 1e-5)


class MeanOfAnotherShapeInSetup(MeanInSetup):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__(lr)
        self.register_buffer("mean", torch.zeros(1))

    def setup(self, stage: str) -> None:
        self.mean = self.trainer.datamodule.train_set.tensors[0].mean(0)  # type: ignore[attr-defined]


def test_a_buffer_setup_gives_another_shape_is_refused_by_name():
    fused = FusedLightningModule([MeanOfAnotherShapeInSetup(lr) for lr in LRS], backend="loop", summary=False)
    with pytest.raises(
        ValueError,
        match=r"trial 0's setup\('fit'\) made its buffer 'mean' \(64,\) torch.float32, where the fused group holds "
        r"\(1,\) torch.float32 for it.*Register the buffer in __init__ with its final shape",
    ):
        fit(fused)


class ShiftInSetup(MeanInSetup):
    """``setup`` registers a buffer of the trial's own value (not the data's)."""

    def setup(self, stage: str) -> None:
        self.register_buffer("mean", torch.full((64,), self.hparams["lr"]))


def test_a_buffer_setup_registers_per_trial_is_refused_where_one_template_runs_every_trial():
    # before: vmap/hfta ran every trial with trial 0's buffer, silently (trial 2 differed from alone by 1.0)
    fused = FusedLightningModule([ShiftInSetup(lr) for lr in LRS], backend="vmap", summary=False)
    with pytest.raises(
        ValueError,
        match=r"setup\('fit'\) registered the buffer 'mean' with values that differ between trials 0 and 1\. .*"
        r"backend='vmap' may run one template module's buffers for every trial.*use backend='loop'",
    ):
        fit(fused)
    trials = []
    for seed, lr in enumerate(LRS):
        torch.manual_seed(seed)
        trials.append(ShiftInSetup(lr))
    alone = copy.deepcopy(trials)
    fused = FusedLightningModule(trials, backend="loop", summary=False)
    fit(fused)
    for index, module in enumerate(alone):
        fit(module)
        assert max_state_difference(fused.unfuse(index), module) == 0.0
