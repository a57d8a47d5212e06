"""The trials' own ``optimizer_step``: code around ``optimizer.step`` runs per trial, as alone, around one group step.

Lightning's docs write a learning-rate warm-up in ``optimizer_step`` (after the step, for the next one), published
transformer code writes it before the step, an EMA of the weights is updated after it, and the docs' alternating
schedule steps every other batch and only runs the closure in the others. Before, a group refused every override at
construction. Now each trial's override runs as alone: each trial's learning rate at every step, its weights, what
it saw after its step and what it logged equal its run alone, on every backend.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends.errors import FusionError
from lightning_hydro.demos import DigitsMLP
from tests.helpers import fit_digits, make_trainer, max_state_difference, seeded, train_fused, train_separately

FIT = dict(max_epochs=2, limit_train_batches=5, limit_val_batches=1)
WARMUP = 4


class WarmupAfterStep(DigitsMLP):
    """The LightningModule docs' warm-up: after each step, the next step's rate."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.rates: list[float] = []  # the rate of every step, as the optimizer saw it
        self.norms: list[float] = []  # the head's weights after every step, as the override saw them

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.rates.append(optimizer.param_groups[0]["lr"])

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        optimizer.step(closure=optimizer_closure)
        self.norms.append(float(self.head.weight.norm()))
        if self.trainer.global_step < WARMUP:
            scale = min(1.0, float(self.trainer.global_step + 1) / WARMUP)
            for group in optimizer.param_groups:
                group["lr"] = scale * self.hparams["lr"]


class WarmupBeforeStep(WarmupAfterStep):
    """Published transformer code's warm-up: this step's rate, set before the step; the rate logged."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        scale = min(1.0, float(self.trainer.global_step + 1) / WARMUP)
        for group in optimizer.param_groups:
            group["lr"] = scale * self.hparams["lr"]
        self.log("lr", optimizer.param_groups[0]["lr"])
        optimizer.step(closure=optimizer_closure)


class Alternating(WarmupAfterStep):
    """The docs' alternating schedule: a step every other batch, the closure alone in the others."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        if (batch_idx + 1) % 2 == 0:
            optimizer.step(closure=optimizer_closure)
        else:
            loss = optimizer_closure()
            self.norms.append(float(loss))  # the trial's own loss, as its closure returns it alone


class StepsByItsRate(WarmupAfterStep):
    """Steps only when its own rate is small: the trials disagree about stepping in one batch."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        if self.hparams["lr"] < 0.1:
            optimizer.step(closure=optimizer_closure)
        else:
            optimizer_closure()


class ClipsByHand(WarmupAfterStep):
    """Runs the closure, clips its own gradients by hand, then steps (reads and changes ``p.grad`` in between)."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        optimizer_closure()
        self.norms.append(float(torch.nn.utils.clip_grad_norm_(self.parameters(), 0.5)))
        optimizer.step()


class SkipsByClearing(WarmupAfterStep):
    """Clears its gradients between the closure and the step in every other batch: no update there, as alone."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        optimizer_closure()
        if batch_idx % 2 == 0:
            optimizer.zero_grad()
        optimizer.step()


class ClearsWhenSkipping(WarmupAfterStep):
    """The alternating schedule, clearing its gradients in the batches it does not step (they step normally after)."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        if (batch_idx + 1) % 2 == 0:
            optimizer.step(closure=optimizer_closure)
        else:
            optimizer_closure()
            optimizer.zero_grad()


class ClosureTwice(WarmupAfterStep):
    """Calls the closure, then passes it to ``optimizer.step`` too: alone the step runs twice (counted here)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps_run = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps_run += 1
        return super().training_step(batch, batch_idx)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        optimizer_closure()
        optimizer.step(closure=optimizer_closure)


class StepsWithoutGrad(WarmupAfterStep):
    """Steps inside ``torch.no_grad()`` (alone, torch's step runs the closure with grad enabled) and reads its modes."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        with torch.no_grad():
            optimizer.step(closure=optimizer_closure)
            self.norms.append(float(torch.is_grad_enabled()))  # 0.0, as alone: the trial's own mode after its step
        self.norms.append(float(torch.is_grad_enabled()))


class ReadsMomentum(WarmupAfterStep):
    """Reads its optimizer's momentum buffers after the step."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        optimizer.step(closure=optimizer_closure)
        self.norms.append(float(sum(s["momentum_buffer"].norm() for s in optimizer.state.values())))


@pytest.mark.parametrize("cls", [ClipsByHand, SkipsByClearing, ClearsWhenSkipping, ClosureTwice, StepsWithoutGrad])
@pytest.mark.parametrize("backend", ["loop", "vmap"])
def test_gradients_and_closures_in_the_override_are_the_trials_own(cls: type, backend: str) -> None:
    trials = _trials(cls)
    alone = train_separately(trials, fit_digits, **FIT)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": backend}, **FIT)
    exact = backend == "loop"
    for row, own in enumerate(alone):
        module = fused.trial_module(row)
        assert module.rates == own.rates
        assert module.norms == (own.norms if exact else pytest.approx(own.norms, rel=1e-5))
        assert max_state_difference(fused.unfuse(row), own) <= (0.0 if exact else 1e-6)
        if cls is ClosureTwice:
            assert module.steps_run == own.steps_run == 20  # 2 epochs x 5 batches x twice
        if cls is StepsWithoutGrad:
            assert module.norms == own.norms == [0.0, 1.0] * 10


def test_the_optimizer_state_is_the_trials_own_on_the_universal_path_and_refused_on_the_fused_one() -> None:
    trials = _trials(ReadsMomentum)
    alone = train_separately(trials, fit_digits, **FIT)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "loop", "optimizer_path": "universal"}, **FIT)
    for row, own in enumerate(alone):
        assert fused.trial_module(row).norms == own.norms
        assert max_state_difference(fused.unfuse(row), own) == 0.0
    fused = FusedLightningModule(_trials(ReadsMomentum), backend="vmap", summary=False)
    with pytest.raises(FusionError, match=r"reads optimizer.state, which the group's fused update keeps stacked"):
        fit_digits(make_trainer(**FIT), fused)


def _trials(cls: type) -> list[DigitsMLP]:
    rates = iter([0.05, 0.1, 0.2])
    return seeded(lambda: cls(lr=next(rates), momentum=0.9), [0, 1, 2])


@pytest.mark.parametrize("cls", [WarmupAfterStep, WarmupBeforeStep, Alternating])
@pytest.mark.parametrize("backend", ["loop", "vmap", "hfta", "auto"])
def test_each_trials_optimizer_step_runs_as_alone(cls: type, backend: str) -> None:
    trials = _trials(cls)
    alone = train_separately(trials, fit_digits, **FIT)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": backend}, **FIT)
    exact = fused.backend == "loop"
    for row, own in enumerate(alone):
        module = fused.trial_module(row)
        assert module.rates == own.rates  # every step's learning rate, warm-up included
        assert len(module.rates) == (10 if cls is not Alternating else 4)
        assert module.norms == (own.norms if exact else pytest.approx(own.norms, rel=1e-5))
        assert max_state_difference(fused.unfuse(row), own) <= (0.0 if exact else 1e-6)
        if cls is WarmupBeforeStep:  # what the override logged, per trial
            assert fused.results[row]["metrics"]["lr"] == pytest.approx(float(own.trainer.callback_metrics["lr"]))


def test_trials_that_disagree_about_stepping_are_refused() -> None:
    fused = FusedLightningModule(_trials(StepsByItsRate), backend="loop", summary=False)
    with pytest.raises(FusionError, match=r"optimizer_step of trials 0 called optimizer.step\(\) and that of trials"):
        fit_digits(make_trainer(**FIT), fused)


def test_a_failing_override_raises_its_own_error() -> None:
    class Fails(WarmupAfterStep):
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
            optimizer.step(closure=optimizer_closure)
            raise KeyError("the override's own bug")

    fused = FusedLightningModule(seeded(lambda: Fails(lr=0.1), [0, 1]), backend="vmap", summary=False)
    with pytest.raises(KeyError, match="the override's own bug"):
        fit_digits(make_trainer(**FIT), fused)
    assert torch.is_grad_enabled()
