"""Lightning's accessors answer per trial in a fused group: ``self.optimizers()``, ``self.lr_schedulers()`` and
``self.trainer.optimizers`` are the trial's own, as in its run alone
(lightning_hydro/fused/lightning/strategy_view.py)."""

from __future__ import annotations

import copy
import math
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch import nn

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends import FusionError
from lightning_hydro.demos import DigitsDataModule
from tests.helpers import fit_digits, make_trainer, max_state_difference, seeded

LIMITS = dict(max_epochs=3, limit_train_batches=4, limit_val_batches=1)


class ReadsItsOptimizer(L.LightningModule):
    """Reads Lightning's accessors in its hooks, as the LightningModule docs' hooks do (one SGD, one StepLR)."""

    def __init__(self, lr: float = 0.1, momentum: float = 0.9, gamma: float = 0.5, two_schedulers: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(64, 10)
        self.seen: list[dict[str, Any]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_epoch_start(self) -> None:
        opt = self.optimizers()
        schedulers = self.lr_schedulers()
        group = opt.param_groups[0]
        self.seen.append(
            {
                "wrapped": isinstance(opt, LightningOptimizer) and isinstance(opt, torch.optim.SGD),
                "lr": group["lr"],
                "momentum": group["momentum"],
                "schedulers": [type(s).__name__ for s in schedulers]
                if isinstance(schedulers, list)
                else type(schedulers).__name__,
                "trainer.optimizers": [type(o).__name__ for o in self.trainer.optimizers],
                "same optimizer": opt.optimizer is self.trainer.optimizers[0] is self.optimizers(False),
            }
        )

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=self.hparams["momentum"])
        step = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=self.hparams["gamma"])
        if self.hparams["two_schedulers"]:
            return [opt], [step, torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)]
        return [opt], [step]


def trials(**kwargs: Any) -> list[ReadsItsOptimizer]:
    configs = [dict(lr=0.1, momentum=0.9, gamma=0.5), dict(lr=0.03, momentum=0.5, gamma=0.9)]
    return [seeded(lambda c=c: ReadsItsOptimizer(**c, **kwargs), [i])[0] for i, c in enumerate(configs)]


def alone(modules: list[L.LightningModule]) -> list[L.LightningModule]:
    out = []
    for module in modules:
        module = copy.deepcopy(module)
        fit_digits(make_trainer(**LIMITS), module)
        out.append(module)
    return out


@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop"])
def test_hooks_see_their_own_optimizer_and_schedulers_as_alone(backend: str) -> None:
    modules = trials()
    expected = alone(modules)
    fused = FusedLightningModule(modules, backend=backend, summary=False)
    fit_digits(make_trainer(**LIMITS), fused)
    for module, own in zip(modules, expected):
        assert module.seen == own.seen
        assert module.seen[-1]["lr"] != module.seen[0]["lr"]  # the trial's own StepLR moved its own lr
    assert modules[0].seen[0]["lr"] != modules[1].seen[0]["lr"]


def test_several_schedulers_come_back_as_a_list_and_one_trials_scheduler_is_its_own() -> None:
    modules = trials(two_schedulers=True)
    expected = alone(modules)
    fused = FusedLightningModule(modules, backend="loop", summary=False)
    fit_digits(make_trainer(**LIMITS), fused)
    for tid, (module, own) in enumerate(zip(modules, expected)):
        assert module.seen == own.seen
        assert module.seen[0]["schedulers"] == ["StepLR", "ExponentialLR"]
        held = [spec.scheduler for spec in fused._optimizer.trials[tid].schedulers]  # type: ignore[union-attr]
        assert module.lr_schedulers() == held  # the real schedulers, not the group's stand-ins


class WarmsUpInAHook(ReadsItsOptimizer):
    """Writes its learning rate through ``self.optimizers()`` at each epoch's start (a hand-made schedule)."""

    def on_train_epoch_start(self) -> None:
        for group in self.optimizers().param_groups:
            group["lr"] = self.hparams["lr"] * 0.5**self.current_epoch

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=self.hparams["momentum"])


@pytest.mark.parametrize("optimizer_path", ["fused", "universal"])
def test_a_learning_rate_written_through_self_optimizers_reaches_the_group_update(optimizer_path: str) -> None:
    configs = [dict(lr=0.5, momentum=0.9), dict(lr=0.05, momentum=0.5)]
    modules = [seeded(lambda c=c: WarmsUpInAHook(**c), [i])[0] for i, c in enumerate(configs)]
    expected = alone(modules)
    fused = FusedLightningModule(modules, backend="vmap", optimizer_path=optimizer_path, summary=False)
    fit_digits(make_trainer(**LIMITS), fused)
    assert fused._optimizer is not None
    assert fused._optimizer.active_path == optimizer_path
    unwritten = alone([seeded(lambda c=c: ReadsItsOptimizer(**c, gamma=1.0), [i])[0] for i, c in enumerate(configs)])
    for tid, own in enumerate(expected):
        assert fused._optimizer.trials[tid].optimizer.param_groups[0]["lr"] == configs[tid]["lr"] * 0.25
        assert max_state_difference(fused.unfuse(tid), own) <= 1e-5
        assert max_state_difference(fused.unfuse(tid), unwritten[tid]) > 1e-3  # the writes changed the training


class LogsItsLearningRate(ReadsItsOptimizer):
    """Logs ``self.optimizers().param_groups[0]["lr"]`` in ``training_step``, as many tutorials do."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("lr", self.optimizers().param_groups[0]["lr"])
        return super().training_step(batch, batch_idx)


def test_the_step_reads_its_own_optimizer_on_the_loop_and_auto_moves_there() -> None:
    modules = [seeded(lambda lr=lr: LogsItsLearningRate(lr=lr), [i])[0] for i, lr in enumerate((0.1, 0.03))]
    expected = alone(modules)
    for backend in ("loop", "auto"):
        fused = FusedLightningModule(
            [copy.deepcopy(m) for m in modules], backend=backend, optimizer_path="universal", summary=False
        )
        trainer = make_trainer(**LIMITS)
        fit_digits(trainer, fused)
        assert fused.backend == "loop"
        for tid, own in enumerate(expected):
            assert fused.results[tid]["metrics"]["lr"] == pytest.approx(own.trainer.callback_metrics["lr"].item())
            assert max_state_difference(fused.unfuse(tid), own) == 0.0
        if backend == "auto":  # vmap and hfta were tried and refused, with the reason
            assert "vmap skipped" in fused.backend_report
            assert "self.optimizers() is read in the step" in fused.backend_report


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_the_step_reading_its_optimizer_is_refused_under_vmap_with_the_line(backend: str) -> None:
    modules = [seeded(lambda lr=lr: LogsItsLearningRate(lr=lr), [i])[0] for i, lr in enumerate((0.1, 0.03))]
    fused = FusedLightningModule(modules, backend=backend, summary=False)
    with pytest.raises(
        FusionError,
        match=r"self\.optimizers\(\) is read in the step at .*test_strategy_view\.py:\d+ in training_step: "
        r"self\.log\(\"lr\", self\.optimizers\(\)\.param_groups\[0\]\[\"lr\"\]\); under vmap and hfta one call runs "
        r"the step of every trial .* Use backend='loop' \(backend='auto' does so by itself\), or read them in a hook",
    ):
        fit_digits(make_trainer(**LIMITS), fused)


def test_a_group_of_one_answers_under_vmap() -> None:
    (module,) = [seeded(lambda: LogsItsLearningRate(lr=0.1), [0])[0]]
    (own,) = alone([module])
    fused = FusedLightningModule([module], backend="vmap", summary=False)
    fit_digits(make_trainer(**LIMITS), fused)
    assert fused.results[0]["metrics"]["lr"] == pytest.approx(own.trainer.callback_metrics["lr"].item())


def test_callbacks_see_the_trials_own_optimizers_too() -> None:
    """A trial's view for callbacks (LearningRateMonitor's) and for the module answer alike."""
    modules = trials()
    fused = FusedLightningModule(modules, backend="loop", summary=False)
    trainer = make_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    trainer.fit(fused, datamodule=DigitsDataModule())
    from lightning_hydro.fused.lightning.callback_view import CallbackTrainerView

    for tid, module in enumerate(modules):
        view = CallbackTrainerView(trainer, fused, tid)
        assert view.optimizers == [fused._optimizer.trials[tid].optimizer]  # type: ignore[union-attr]
        assert view.optimizers == module.trainer.optimizers
        assert [c.scheduler for c in view.lr_scheduler_configs] == [module.lr_schedulers()]


class EpochCosine:
    """A scheduler of another library's kind (timm's): ``step(epoch=...)`` sets the rate for that epoch."""

    def __init__(self, optimizer: torch.optim.Optimizer, epochs: int) -> None:
        self.optimizer, self.epochs = optimizer, epochs
        self.base = [group["lr"] for group in optimizer.param_groups]

    def step(self, epoch: int) -> None:
        scale = 0.5 * (1 + math.cos(math.pi * (epoch + 1) / self.epochs))
        for group, base in zip(self.optimizer.param_groups, self.base):
            group["lr"] = base * scale

    def state_dict(self) -> dict[str, Any]:
        return {"base": self.base}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base = state["base"]


class CustomScheduled(ReadsItsOptimizer):
    """Lightning's recipe for such a scheduler: override ``lr_scheduler_step``."""

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=self.hparams["momentum"])
        return {"optimizer": opt, "lr_scheduler": {"scheduler": EpochCosine(opt, epochs=4), "interval": "epoch"}}

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        scheduler.step(epoch=self.current_epoch)


def test_a_trials_own_lr_scheduler_step_steps_its_scheduler_of_another_library() -> None:
    modules = [seeded(lambda lr=lr: CustomScheduled(lr=lr), [i])[0] for i, lr in enumerate((0.1, 0.03))]
    expected = alone(modules)
    fused = FusedLightningModule(modules, backend="vmap", summary=False)
    fit_digits(make_trainer(**LIMITS), fused)
    for module, own in zip(modules, expected):
        assert module.seen == own.seen
        assert [s["lr"] for s in module.seen][1:] == pytest.approx(
            [module.hparams["lr"] * 0.5 * (1 + math.cos(math.pi * (e + 1) / 4)) for e in range(2)]
        )


class ZeroesItsOwnWay(ReadsItsOptimizer):
    """The LightningModule docs' ``optimizer_zero_grad`` override (``set_to_none``)."""

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        optimizer.zero_grad(set_to_none=False)


def test_an_overridden_optimizer_zero_grad_is_refused_rather_than_skipped() -> None:
    with pytest.raises(
        ValueError,
        match=r"ZeroesItsOwnWay overrides optimizer_zero_grad, which a fused group does not call per trial.*"
        r"Trainer\(accumulate_grad_batches=\.\.\.\)",
    ):
        FusedLightningModule([ZeroesItsOwnWay(), ZeroesItsOwnWay()])
