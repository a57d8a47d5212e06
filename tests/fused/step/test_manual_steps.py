"""Trials that use manual optimization (a GAN's two optimizers, clipping and accumulation by hand) fuse, each trial
equal to its run alone (lightning_hydro/fused/step/manual_steps.py)."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends import FusionError
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from tests.fused.step.manual_modules import GAN, ManualMLP, NoisyDigits
from tests.helpers import make_trainer, max_state_difference, seeded

GAN_LIMITS = dict(max_epochs=3, limit_train_batches=5, limit_val_batches=1)
MLP_LIMITS = dict(max_epochs=3, limit_train_batches=5, limit_val_batches=1)  # the last batch of each epoch: no step


def gans(**kwargs: Any) -> list[GAN]:
    return [seeded(lambda lr=lr: GAN(lr=lr, **kwargs), [i])[0] for i, lr in enumerate((2e-4, 1e-3, 5e-3))]


def mlps(**kwargs: Any) -> list[ManualMLP]:
    return [seeded(lambda lr=lr: ManualMLP(lr=lr, **kwargs), [i])[0] for i, lr in enumerate((0.3, 0.1, 0.03))]


def fit(module: L.LightningModule, data: L.LightningDataModule, **limits: Any) -> L.Trainer:
    trainer = make_trainer(**limits)
    trainer.fit(module, datamodule=data)
    return trainer


def alone(modules: list[Any], data: type[L.LightningDataModule], **limits: Any) -> list[tuple[Any, L.Trainer]]:
    out = []
    for module in modules:
        module = copy.deepcopy(module)
        out.append((module, fit(module, data(), **limits)))
    return out


@pytest.mark.parametrize("backend", ["loop", "auto"])
def test_gan_trials_fused_equal_each_trial_trained_alone(backend: str) -> None:
    trials = gans()
    expected = alone(trials, NoisyDigits, **GAN_LIMITS)
    fused = FusedLightningModule([copy.deepcopy(m) for m in trials], backend=backend, summary=False)
    trainer = fit(fused, NoisyDigits(), **GAN_LIMITS)
    assert fused.backend == "loop"
    assert trainer.global_step == expected[0][1].global_step == 2 * 3 * 5  # two optimizer steps per batch
    for tid, (own, own_trainer) in enumerate(expected):
        mine = fused.unfuse(tid)
        assert max_state_difference(mine, own) == 0.0  # bitwise: each trial's own code on its own rows
        for k, optimizer in enumerate(fused._optimizer.trials[tid].optimizers):  # type: ignore[union-attr]
            theirs = own_trainer.optimizers[k].state_dict()["state"]
            for index, state in optimizer.state_dict()["state"].items():
                assert torch.equal(state["exp_avg"], theirs[index]["exp_avg"]), (tid, k, index)
        for name in ("g_loss", "d_loss", "val/d_real"):
            assert fused.results[tid]["metrics"][name] == pytest.approx(own_trainer.callback_metrics[name].item())
        assert fused.results[tid]["steps"] == own_trainer.global_step
    assert len({round(fused.results[t]["metrics"]["g_loss"], 6) for t in range(3)}) == 3  # the trials differ


def test_auto_chooses_the_loop_for_manual_optimization_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    fused = FusedLightningModule(gans()[:2], backend="auto", summary=False)
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        fit(fused, NoisyDigits(), max_epochs=1, limit_train_batches=1, limit_val_batches=0)
    assert fused.backend == "loop"
    assert fused.results[0]["backend"] == "loop"
    reason = (
        "backend='auto' chose 'loop' without timing: the trials use manual optimization (automatic_optimization = "
        "False): their training_step calls manual_backward and opt.step() itself, which runs per trial only on 'loop'"
    )
    assert reason in fused.backend_report
    assert reason in caplog.text


def test_manual_steps_with_clipping_accumulation_and_their_own_scheduler_equal_each_trial_alone() -> None:
    trials = mlps()
    expected = alone(trials, DigitsDataModule, **MLP_LIMITS)
    fused = FusedLightningModule([copy.deepcopy(m) for m in trials], backend="loop", summary=False)
    trainer = fit(fused, DigitsDataModule(), **MLP_LIMITS)
    assert trainer.global_step == expected[0][1].global_step == 3 * 2  # one step per two batches
    unclipped = alone(mlps(clip=None), DigitsDataModule, **MLP_LIMITS)
    for tid, (own, own_trainer) in enumerate(expected):
        assert max_state_difference(fused.unfuse(tid), own) == 0.0
        own_lr = own_trainer.optimizers[0].param_groups[0]["lr"]
        assert fused._optimizer.trials[tid].optimizer.param_groups[0]["lr"] == own_lr  # type: ignore[union-attr]
        assert own_lr == pytest.approx(trials[tid].hparams["lr"] * 0.5**3)  # the step stepped its StepLR
        for name in ("val_loss", "train_loss"):  # train_loss: the last batch's, which did not step
            assert fused.results[tid]["metrics"][name] == pytest.approx(own_trainer.callback_metrics[name].item())
        assert max_state_difference(unclipped[tid][0], own) > 1e-3  # clipping changed the training


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_vmap_and_hfta_refuse_manual_optimization_and_say_what_to_use(backend: str) -> None:
    with pytest.raises(
        FusionError,
        match=rf"FusedLightningModule\(backend='{backend}'\): GAN uses manual optimization \(automatic_optimization "
        r"= False\): its training_step calls manual_backward and opt\.step\(\) itself, which runs per trial only on "
        rf"backend='loop' .* under {backend} one call runs every trial's step at once, and a backward or an "
        r"optimizer step cannot run inside it\. Use backend='loop', or backend='auto', which chooses 'loop'",
    ):
        FusedLightningModule(gans()[:2], backend=backend)  # type: ignore[arg-type]


def test_a_group_runs_one_kind_of_optimization() -> None:
    with pytest.raises(
        ValueError,
        match=r"trials \[1\] use manual optimization \(automatic_optimization = False\) and the others automatic "
        r"optimization; a group runs one kind of training step\. Fuse them in separate groups\.",
    ):
        FusedLightningModule([DigitsMLP(hidden_dim=8), ManualMLP()])
    fused = FusedLightningModule(mlps()[:2], backend="loop", max_slots=3, summary=False)
    with pytest.raises(
        ValueError,
        match=r"add_trial: the trial uses automatic optimization and the group's trials manual optimization; a "
        r"group runs one kind of training step\. Add it to a group of its kind\.",
    ):
        fused.add_trial(DigitsMLP(hidden_dim=8))


def test_a_diverging_trial_leaves_its_slot_and_the_others_equal_their_runs_alone() -> None:
    trials = gans()
    poisoned = seeded(lambda: GAN(lr=1e-3, poison_at=4), [1])[0]
    trials[1] = poisoned
    fused = FusedLightningModule([copy.deepcopy(m) for m in trials], backend="loop", summary=False)
    fit(fused, NoisyDigits(), **GAN_LIMITS)
    assert fused.results[1]["status"] == "diverged"
    assert fused.results[1]["reason"] == "non-finite loss"
    assert fused.trial_ids == [0, 2]
    # its last finite weights: those after the two batches (four optimizer steps) before its loss went NaN
    (before, _) = alone([poisoned], NoisyDigits, max_steps=4)[0]
    (healthy, _) = alone([seeded(lambda: GAN(lr=1e-3), [1])[0]], NoisyDigits, **GAN_LIMITS)[0]
    left = fused.unfuse(1)
    assert all(torch.isfinite(v).all() for v in left.state_dict().values())
    assert max_state_difference(left, before) == 0.0
    assert max_state_difference(left, healthy) > 0.0
    for tid, (own, _) in zip((0, 2), alone([trials[0], trials[2]], NoisyDigits, **GAN_LIMITS)):
        assert max_state_difference(fused.unfuse(tid), own) == 0.0  # the others: untouched


def test_a_resumed_manual_group_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    """Both optimizers of every trial, and Lightning's step count, come back from the group checkpoint."""
    trials = gans()
    whole = FusedLightningModule([copy.deepcopy(m) for m in trials], backend="loop", summary=False)
    fit(whole, NoisyDigits(), max_epochs=4, limit_train_batches=5, limit_val_batches=1)
    first = FusedLightningModule([copy.deepcopy(m) for m in trials], backend="loop", summary=False)
    trainer = fit(first, NoisyDigits(), max_epochs=2, limit_train_batches=5, limit_val_batches=1)
    trainer.save_checkpoint(tmp_path / "half.ckpt")
    resumed = FusedLightningModule([copy.deepcopy(m) for m in trials], backend="loop", summary=False)
    trainer = make_trainer(max_epochs=4, limit_train_batches=5, limit_val_batches=1)
    trainer.fit(resumed, datamodule=NoisyDigits(), ckpt_path=tmp_path / "half.ckpt", weights_only=False)
    assert trainer.global_step == 2 * 4 * 5
    for tid in range(3):
        assert max_state_difference(resumed.unfuse(tid), whole.unfuse(tid)) == 0.0
        assert resumed.results[tid]["steps"] == whole.results[tid]["steps"] == 40


class StopAndRefill(L.Callback):
    """Stops trial 1 after the first epoch's validation and puts a new GAN in its slot, as ASHA does."""

    def __init__(self, newcomer: GAN) -> None:
        self.newcomer = newcomer

    def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if not trainer.sanity_checking and trainer.current_epoch == 0:
            pl_module.stop_trial(1, "a decision")
            pl_module.add_trial(self.newcomer, 7)


def test_stop_and_add_trial_in_a_manual_group() -> None:
    trials = gans()
    newcomer = seeded(lambda: GAN(lr=3e-3), [7])[0]
    fused = FusedLightningModule([copy.deepcopy(m) for m in trials], backend="loop", summary=False)
    trainer = make_trainer(callbacks=[StopAndRefill(copy.deepcopy(newcomer))], **GAN_LIMITS)
    trainer.fit(fused, datamodule=NoisyDigits())
    assert fused.trial_ids == [0, 2, 7]
    for tid, (own, _) in zip((0, 2), alone([trials[0], trials[2]], NoisyDigits, **GAN_LIMITS)):
        assert max_state_difference(fused.unfuse(tid), own) == 0.0  # the survivors kept both optimizers' states
    (stopped, _) = alone(trials[1:2], NoisyDigits, max_epochs=1, limit_train_batches=5, limit_val_batches=1)[0]
    assert max_state_difference(fused.unfuse(1), stopped) == 0.0
    # the newcomer trained two epochs with fresh optimizers (the data come in a fixed order: as its own 2 epochs)
    (joined, _) = alone([newcomer], NoisyDigits, max_epochs=2, limit_train_batches=5, limit_val_batches=1)[0]
    assert max_state_difference(fused.unfuse(7), joined) == 0.0
    assert fused.results[7]["steps"] == 2 * 2 * 5


def test_a_manual_trials_own_checkpoint_holds_both_optimizers_and_loads_into_its_class(tmp_path: Path) -> None:
    trials = gans()
    fused = FusedLightningModule([copy.deepcopy(m) for m in trials], backend="loop", summary=False)
    trainer = make_trainer(
        callbacks=[ModelCheckpoint(dirpath=tmp_path, monitor="val/d_real", mode="max")],
        enable_checkpointing=True,
        **GAN_LIMITS,
    )
    trainer.fit(fused, datamodule=NoisyDigits())
    best = trainer.checkpoint_callback.best_model_path  # type: ignore[union-attr]
    assert Path(best).parent.name.startswith("trial_")
    checkpoint = torch.load(best, weights_only=False)
    assert len(checkpoint["optimizer_states"]) == 2  # the generator's and the discriminator's Adam
    loaded = GAN.load_from_checkpoint(best)
    tid = int(Path(best).parent.name.removeprefix("trial_"))
    epochs = checkpoint["epoch"] + 1
    limits = dict(max_epochs=epochs, limit_train_batches=5, limit_val_batches=1)
    (own, _) = alone(trials[tid : tid + 1], NoisyDigits, **limits)[0]
    assert max_state_difference(loaded, own) == 0.0  # the trial as it was at its best epoch


class CountsItsHooks(GAN):
    """Counts the backward and optimizer-step hooks Lightning calls around manual_backward and opt.step()."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls = {"on_before_backward": 0, "on_after_backward": 0, "on_before_optimizer_step": 0}
        self.norms: list[float] = []

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.calls["on_before_backward"] += 1

    def on_after_backward(self) -> None:
        self.calls["on_after_backward"] += 1

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.calls["on_before_optimizer_step"] += 1
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self.norms.append(float(torch.stack([g.norm() for g in grads]).norm()))


def test_the_trials_backward_and_optimizer_step_hooks_run_as_alone() -> None:
    trials = [seeded(lambda lr=lr: CountsItsHooks(lr=lr), [i])[0] for i, lr in enumerate((2e-4, 5e-3))]
    expected = alone(trials, NoisyDigits, **GAN_LIMITS)
    fused = FusedLightningModule(trials, backend="loop", summary=False)
    fit(fused, NoisyDigits(), **GAN_LIMITS)
    for module, (own, _) in zip(trials, expected):
        assert module.calls == own.calls == dict.fromkeys(own.calls, 2 * 3 * 5)
        assert module.norms == own.norms  # each saw its own gradients
