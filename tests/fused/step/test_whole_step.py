"""compile=: a steady step as one compiled function (forward, backward, clipping, update) trains as the eager fit."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import pytest
import torch

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.fused.step import fused_update, whole_step
from lightning_hydro.fused.step.whole_step import whole_step_blocker
from tests.helpers import (
    StopTrialAt,
    fit_digits,
    learned_state_difference,
    make_trainer,
    max_state_difference,
    seeded,
    train_separately,
)


def _trials(optimizer: str, lrs: tuple[float, ...] = (0.05, 0.1, 0.02), **kwargs: Any) -> list[DigitsMLP]:
    kwargs.setdefault("hidden_dim", 16)
    return [
        seeded(lambda lr=lr: DigitsMLP(lr=lr, optimizer=optimizer, **kwargs), [i])[0]  # type: ignore[misc]
        for i, lr in enumerate(lrs)
    ]


def _fit(trials: list[L.LightningModule], compile: bool | str, steps: int = 12, **trainer: Any) -> FusedLightningModule:
    every = trainer.pop("divergence_check_every", None)
    backend = trainer.pop("backend", "vmap")
    fused = FusedLightningModule(trials, backend=backend, compile=compile, summary=False, divergence_check_every=every)
    fit_digits(make_trainer(max_steps=steps, limit_val_batches=0, **trainer), fused)
    return fused


def _assert_same_training(compiled: FusedLightningModule, eager: FusedLightningModule, tolerance: float) -> None:
    assert compiled.results.keys() == eager.results.keys()
    for tid in eager.results:
        assert compiled.results[tid]["steps"] == eager.results[tid]["steps"]
        assert compiled.results[tid]["status"] == eager.results[tid]["status"]
        assert max_state_difference(compiled.unfuse(tid), eager.unfuse(tid)) <= tolerance, tid


def test_a_compiled_fit_runs_its_steady_steps_whole_and_trains_each_trial_as_the_eager_fit():
    # Adam, per-row norm clipping: after the first (split) step every step is one compiled function
    eager = _fit(_trials("adam"), False, gradient_clip_val=0.5)
    compiled = _fit(_trials("adam"), True, gradient_clip_val=0.5)
    whole = compiled._training_step.whole
    assert whole.reason == ""
    assert whole.whole_steps == 11  # the first step is split: it verifies the fusion and learns the gradients
    # the first whole steps were checked against the same step run eagerly: the same within float rounding
    assert (whole.checks, whole.unchecked, whole.failure) == (3, "", "")
    assert whole.worst <= 1e-2
    assert compiled.compile_report == (
        "compile=True: 11 training steps ran whole (forward, backward and update as one compiled function); 3 checked "
        f"against the same step run eagerly, the largest difference {whole.worst:.2g} of what float rounding allows"
    )
    assert eager.compile_report == "compile is off"
    _assert_same_training(compiled, eager, 1e-5)


def _stepping_twice(monkeypatch: pytest.MonkeyPatch, wrong_from: int = 1) -> None:
    """torch.compile of the whole step gives a function that computes otherwise: from its ``wrong_from``-th call on,
    it runs the step twice."""
    real = whole_step.compile_whole_step

    def compile_(setting: Any) -> Any:
        compiled = real(setting)
        calls = []

        def twice(*args: Any) -> Any:
            calls.append(1)
            if len(calls) >= wrong_from:
                compiled(*args)
            return compiled(*args)

        return twice

    monkeypatch.setattr(whole_step, "compile_whole_step", compile_)


@pytest.mark.parametrize(("optimizer", "wrong_from"), [("sgd", 1), ("adam", 1), ("adam", 2), ("sgd", 3)])
def test_a_whole_step_that_computes_otherwise_is_found_at_a_checked_step_and_the_fit_goes_on_eagerly(
    optimizer, wrong_from, monkeypatch, caplog
):
    # as Adam's compiled update did on CUDA (H200, torch 2.11), but in the whole step, whose update the split
    # update's check never sees: its first steps are checked against the same step run eagerly, the eager result
    # kept. Wrong only from the second step on (a wrong read of the state compiled code wrote; a CUDA graph's
    # recording) or the third (its first replay): found there
    eager = _fit(_trials(optimizer), False)
    _stepping_twice(monkeypatch, wrong_from)
    with caplog.at_level(logging.WARNING, logger="lightning_hydro"):
        compiled = _fit(_trials(optimizer), True)
    whole = compiled._training_step.whole
    assert (whole.checks, whole.whole_steps) == (wrong_from, wrong_from)  # the checked steps; every later one split
    assert whole.worst > 10  # the step taken twice: an error as large as the step, 100x what is allowed
    said = f"its compiled step (check {wrong_from} of 3) computed otherwise than the same step run eagerly on cpu"
    assert whole.failure.startswith(said)
    lines = [r.getMessage() for r in caplog.records if "runs every step eagerly from now on" in r.getMessage()]
    assert len(lines) == 1
    # the split step's compiled pieces run eagerly too: the forward and backward, and the update
    said = f"the whole step's check: its compiled step (check {wrong_from} of 3) computed otherwise"
    assert compiled._training_step.policy.backend.compile_failure.startswith(said)
    assert compiled._optimizer.fused._compiled.failure.startswith(said)
    _assert_same_training(compiled, eager, 1e-5)


def test_a_whole_step_that_draws_random_numbers_is_not_compared_and_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="lightning_hydro"):
        compiled = _fit(_trials("sgd", dropout=0.5), True)
    whole = compiled._training_step.whole
    assert (whole.checks, whole.failure) == (3, "")
    assert whole.unchecked.startswith("the step draws random numbers")
    said = [r for r in caplog.records if "the whole step's check: the step draws random numbers" in r.getMessage()]
    assert len(said) == 1
    assert whole.whole_steps == 11


def test_the_whole_steps_check_compares_by_kind_and_leaves_out_what_adam_makes_of_rounding_noise():
    from lightning_hydro.backends.compile_check import group_mismatch

    before = [torch.zeros(4), torch.zeros(2)]
    eager = [torch.full((4,), 0.1), torch.tensor([1e-3, -1e-3])]  # the second: Adam's step on a noise gradient
    flipped = [eager[0].clone(), -eager[1]]  # compiled code rounded that gradient to the other sign
    assert float(group_mismatch(before, flipped, eager, relative=1e-2)) > 1
    noise = [None, torch.tensor([True, True])]
    assert float(group_mismatch(before, flipped, eager, relative=1e-2, ignore=noise)) == 0.0
    wrong = [eager[0] * 2, eager[1].clone()]  # a step taken twice is not left out
    assert float(group_mismatch(before, wrong, eager, relative=1e-2, ignore=noise)) > 10


@pytest.mark.slow
def test_reduce_overhead_on_the_cpu_runs_the_whole_step_with_its_outputs_copied():
    # on the CPU inductor records no CUDA graph; the static marking, the step marks and the copies of the outputs
    # (a CUDA graph's outputs are overwritten by its next replay) run as on a GPU
    from torch._dynamo.utils import counters

    eager = _fit(_trials("adam"), False, gradient_clip_val=0.5)
    counters.clear()
    compiled = _fit(_trials("adam"), "reduce-overhead", gradient_clip_val=0.5)
    assert compiled._training_step.whole.whole_steps == 11
    # inductor says it records no CUDA graph on the CPU (the GPU test asserts this count is 0 on CUDA)
    assert counters["inductor"]["cudagraph_skips"] > 0
    stacked = next(iter(compiled._group.params.values()))
    assert getattr(stacked, "_dynamo_static_input_type", None) == "unguarded"
    _assert_same_training(compiled, eager, 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("optimizer", "clip"),
    [("sgd", {}), ("sgd", {"gradient_clip_val": 0.01, "gradient_clip_algorithm": "value"}), ("adamw", {})],
)
def test_the_whole_step_equals_eager_for_each_fused_update_and_clipping(optimizer, clip):
    kwargs = {"momentum": 0.9, "weight_decay": 1e-3} if optimizer == "sgd" else {"weight_decay": 1e-2}
    eager = _fit(_trials(optimizer, **kwargs), False, **clip)
    compiled = _fit(_trials(optimizer, **kwargs), True, **clip)
    assert compiled._training_step.whole.whole_steps == 11
    _assert_same_training(compiled, eager, 1e-5)


def test_hfta_compiles_as_the_torch_modules_under_vmap_and_trains_as_its_eager_fit():
    # dynamo traces an autograd.Function's forward, not its vmap rule: under torch.compile each fused operator runs
    # the torch module's own forward (vmap's batching rules), which the compile checks hold to the eager hfta step
    eager = _fit(_trials("adam"), False, backend="hfta")
    compiled = _fit(_trials("adam"), True, backend="hfta")
    whole = compiled._training_step.whole
    assert (whole.whole_steps, whole.reason, whole.failure) == (11, "", "")
    assert (whole.checks, whole.worst <= 1e-2) == (3, True)
    assert compiled._training_step.policy.backend.name == "hfta"
    _assert_same_training(compiled, eager, 1e-5)


def test_hfta_trials_with_their_own_dropout_rates_are_not_compiled_as_one_torch_module(caplog):
    # the torch module's forward would drop every trial's units at the template's rate: hfta's rule honours each
    # trial's, so these trials keep it, eagerly (and no compile check compares steps that draw random numbers)
    trials = [
        seeded(lambda p=p: DigitsMLP(hidden_dim=16, lr=0.05, optimizer="adam", dropout=p), [i])[0]
        for i, p in enumerate((0.1, 0.3, 0.5))
    ]
    with caplog.at_level(logging.WARNING, logger="lightning_hydro"):
        compiled = _fit(trials, True, steps=4, backend="hfta")
    backend = compiled._training_step.policy.backend
    assert backend.name == "hfta"
    assert backend.compile_failure.startswith("torch.compile failed")
    assert compiled._training_step.whole.whole_steps == 0
    assert any("falls back to eager" in r.getMessage() for r in caplog.records)
    report = compiled.compile_report
    assert report.startswith("compile=True: 0 training steps ran whole")
    assert report.endswith(f"ran split: {backend.compile_failure}")  # said once
    fused = [m for m in backend.template().modules() if type(m).__name__ == "FusedDropout"]
    assert fused
    assert not any(m.settings_agree for m in fused)


@pytest.mark.slow
def test_a_batchnorm_network_on_hfta_compiles_and_trains_as_its_eager_fit():
    def trials() -> list[L.LightningModule]:
        return [seeded(lambda lr=lr: _BatchNormNet(lr), [i])[0] for i, lr in enumerate((1e-3, 3e-3, 1e-2))]

    eager, compiled = _fit(trials(), False, backend="hfta"), _fit(trials(), True, backend="hfta")
    whole = compiled._training_step.whole
    assert (whole.whole_steps, whole.failure) == (11, ""), whole.reason
    for tid in eager.results:
        assert learned_state_difference(compiled.unfuse(tid), eager.unfuse(tid)) <= 1e-5


def test_every_group_compiles_into_a_cache_of_its_own():
    # dynamo counts compiled graphs per code object: were the step's code shared, the second group's compile would
    # pass a limit of one, and it would run split (and its split step eagerly)
    with torch._dynamo.config.patch(recompile_limit=1):
        for width in (16, 24):  # another shape: the first group's graph does not fit the second
            fused = _fit(_trials("adam", hidden_dim=width), True, steps=3)
            assert fused._training_step.whole.whole_steps == 2
            assert fused._training_step.whole.reason == ""


@pytest.mark.slow
def test_a_slot_change_recompiles_the_whole_step_and_training_goes_on_as_eager():
    eager = _fit(_trials("sgd", momentum=0.9), False, callbacks=[StopTrialAt(5)])
    compiled = _fit(_trials("sgd", momentum=0.9), True, callbacks=[StopTrialAt(5)])
    assert compiled.results[1]["steps"] == 5
    assert compiled._training_step.whole.whole_steps >= 9  # the step after the change learns the new rows split
    _assert_same_training(compiled, eager, 1e-5)


class _OneNanStepMLP(DigitsMLP):
    """Its loss is NaN at its ``fault_step``-th step only (buffers: each trial its own), finite before and after.

    It counts its steps in a buffer: a step that reads ``self.global_step`` needs a new graph for every value.
    """

    def __init__(self, fault_step: float = float("inf"), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.register_buffer("fault_step", torch.tensor(float(fault_step)))
        self.register_buffer("steps", torch.tensor(0.0))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.steps.add_(1)
        return torch.where(self.fault_step == self.steps, float("nan"), loss)


@pytest.mark.slow
def test_a_diverged_trial_stays_skipped_until_the_read_back_as_in_the_eager_fit():
    def trials() -> list[L.LightningModule]:
        return [
            seeded(lambda s=s: _OneNanStepMLP(s, hidden_dim=16, lr=0.1), [i])[0]
            for i, s in enumerate([float("inf"), 5, float("inf")])
        ]

    # read back every 8 steps (as on an accelerator): trial 1's loss is NaN at its 5th step only, but its row must
    # stay skipped until the read-back, which then stops it
    eager = _fit(trials(), False, divergence_check_every=8)
    compiled = _fit(trials(), True, divergence_check_every=8)
    assert eager.results[1]["status"] == "diverged"
    assert compiled._training_step.whole.whole_steps >= 8
    _assert_same_training(compiled, eager, 1e-5)


def test_a_whole_step_that_cannot_compile_runs_the_split_step_with_one_log_line(monkeypatch, caplog):
    def cannot_compile(function: Any, **kwargs: Any) -> Any:
        def fails(*args: Any, **kw: Any) -> None:
            raise torch._dynamo.exc.Unsupported("a stand-in for what dynamo cannot trace")

        return fails

    eager = _fit(_trials("adam"), False)
    monkeypatch.setattr(whole_step, "compile_whole_step", cannot_compile)
    with caplog.at_level(logging.INFO, logger="lightning_hydro"):
        fallen_back = _fit(_trials("adam"), True)
    whole = fallen_back._training_step.whole
    lines = [r.getMessage() for r in caplog.records if "runs the split step from now on" in r.getMessage()]
    assert len(lines) == 1
    assert "a stand-in for what dynamo cannot trace" in lines[0]
    assert whole.whole_steps == 0
    assert whole.failure.startswith("torch.compile failed (Unsupported")
    _assert_same_training(fallen_back, eager, 1e-5)  # the split step (compiled) took over


def test_an_update_not_known_to_compile_right_on_the_device_runs_eagerly_and_the_step_split(monkeypatch, caplog):
    # on CUDA, Adam's compiled device work trained otherwise than its eager one (H200, torch 2.11): there
    # FusedAdamUpdate.COMPILED_ON leaves CUDA out; here the CPU is left out to run that path
    monkeypatch.setattr(fused_update.FusedAdamUpdate, "COMPILED_ON", ("cuda",))
    eager = _fit(_trials("adam"), False, gradient_clip_val=0.5)
    with caplog.at_level(logging.INFO, logger="lightning_hydro"):
        compiled = _fit(_trials("adam"), True, gradient_clip_val=0.5)
    whole = compiled._training_step.whole
    assert whole.whole_steps == 0
    assert whole.reason.startswith("torch.compile of FusedAdamUpdate's device work is not known to compute")
    update = compiled._optimizers._compiled_update
    assert update is not None
    assert update.calls == 0
    assert update.failure == whole.reason
    eager_lines = [
        r.getMessage() for r in caplog.records if "runs the fused optimizer update eagerly" in r.getMessage()
    ]
    assert len(eager_lines) == 1
    assert "on cpu (checked on: cuda)" in eager_lines[0]
    _assert_same_training(compiled, eager, 1e-5)


def test_which_updates_compile_on_which_devices():
    params = [torch.nn.Parameter(torch.zeros(3, 4, device="meta"))]  # a device no update was checked on
    assert fused_update.FusedSGDUpdate(params).why_not_compiled() == ""  # checked on the CPU and CUDA
    assert "on meta (checked on: cpu)" in fused_update.FusedAdamUpdate(params).why_not_compiled()
    on_cpu = [torch.nn.Parameter(torch.zeros(3, 4))]
    assert fused_update.FusedAdamUpdate(on_cpu, decoupled=True).why_not_compiled() == ""


class _GradientWatcher(DigitsMLP):
    def on_after_backward(self) -> None:
        self.seen = True


class _CallbackWithGradients(L.Callback):
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: Any, optimizer: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("trainer", "hooks", "reason"),
    [
        ({"accumulate_grad_batches": 2}, (), "gradients are accumulated over 2 batches"),
        ({"precision": "bf16-mixed"}, (), "precision='bf16-mixed'"),
        ({"callbacks": [_CallbackWithGradients()]}, (), "callback _CallbackWithGradients implements"),
        ({}, ("on_after_backward", "on_train_batch_end"), "the trials override on_after_backward"),
        ({}, ("on_train_batch_end",), ""),
    ],
)
def test_what_needs_the_split_step_is_named(trainer, hooks, reason):
    blocker = whole_step_blocker(make_trainer(**trainer), hooks)
    assert blocker.startswith(reason) if reason else blocker == ""


def test_a_trial_hook_between_backward_and_update_keeps_the_split_step(caplog):
    trials = [seeded(lambda lr=lr: _GradientWatcher(hidden_dim=16, lr=lr), [i])[0] for i, lr in enumerate((0.1, 0.2))]
    with caplog.at_level(logging.INFO, logger="lightning_hydro"):
        fused = _fit(trials, True, steps=3)
    whole = fused._training_step.whole
    assert whole.whole_steps == 0
    assert whole.reason.startswith("the trials override on_after_backward")
    assert sum("runs the split step" in r.getMessage() for r in caplog.records) == 1  # said once, not per step


@pytest.mark.slow
def test_the_template_module_runs_whole_and_trains_and_logs_as_the_eager_fit():
    # lightning-hydra-template's module: BatchNorm, torchmetrics called in the step (replayed per trial after it), a
    # ReduceLROnPlateau per trial, validation between epochs. Until the metric recorder let go of the batched
    # tensors it had recorded, inductor failed on its step, split or whole ("Cannot access storage of
    # BatchedTensorImpl")
    import functools

    from lightning_hydro.demos.template_mnist import DigitsMNISTDataModule, MNISTLitModule, SimpleDenseNet

    def trials() -> list[L.LightningModule]:
        def build(lr: float) -> MNISTLitModule:
            return MNISTLitModule(
                net=SimpleDenseNet(lin1_size=32, lin2_size=32, lin3_size=16),
                optimizer=functools.partial(torch.optim.Adam, lr=lr),
                scheduler=functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, mode="min", patience=0),
            )

        return [seeded(functools.partial(build, lr), [seed])[0] for seed, lr in enumerate((3e-3, 1e-2, 3e-2))]

    def fit(compile: bool) -> FusedLightningModule:
        fused = FusedLightningModule(trials(), backend="vmap", compile=compile, summary=False)
        trainer = make_trainer(max_epochs=2, limit_train_batches=6, limit_val_batches=2)
        trainer.fit(fused, datamodule=DigitsMNISTDataModule(batch_size=64))
        return fused

    eager, compiled = fit(False), fit(True)
    whole = compiled._training_step.whole
    assert whole.reason == ""
    assert whole.whole_steps == 11
    logged_eager, logged_compiled = eager.training_epoch_values(), compiled.training_epoch_values()
    for tid in eager.results:
        assert compiled.results[tid]["steps"] == eager.results[tid]["steps"] == 12
        # the biases feeding BatchNorm (zero gradient but for rounding) part by Adam-amplified rounding noise
        assert learned_state_difference(compiled.unfuse(tid), eager.unfuse(tid)) <= 1e-5
        # what each trial's torchmetrics logged in training, replayed per trial from the compiled step's outputs
        # (validation runs in eval mode, on the running means that the rounding noise above moves: not compared)
        assert "train/acc" in logged_eager[tid]
        assert logged_compiled[tid].keys() == logged_eager[tid].keys()
        for name in (n for n in logged_eager[tid] if n.startswith("train/")):
            assert logged_compiled[tid][name] == pytest.approx(logged_eager[tid][name], abs=1e-5), name


@pytest.mark.slow
def test_dropout_and_an_epochs_short_last_batch_run_whole():
    # compiled code draws its own random numbers (not eager's): the masks differ from eager's, each trial its own.
    # The 23rd batch of the digits (1437 samples in batches of 64) holds 29: it needs another graph (static shapes:
    # under dynamic ones vmap's dropout fails to trace), so it runs split, which relearns the parameters first
    trials = _trials("sgd", dropout=0.5)
    compiled = _fit(trials, True, steps=30)
    assert compiled._training_step.whole.whole_steps == 28, compiled._training_step.whole.reason
    weights = [compiled.unfuse(tid).body[0].weight for tid in (0, 1, 2)]
    assert all(torch.isfinite(w).all() for w in weights)


def test_an_epochs_short_last_batch_runs_split_once_and_whole_in_the_later_epochs(caplog):
    # 3 epochs of the digits: 22 batches of 64 and one of 29 each. The first short batch needs a graph of its own: it
    # runs split, relearning which parameters take gradients; the next short batch, an epoch later, traces that
    # graph (before, each epoch's short batch ran split: the permission to trace went to the batch after it)
    eager = _fit(_trials("sgd"), False, steps=69)
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        compiled = _fit(_trials("sgd"), True, steps=69)
    whole = compiled._training_step.whole
    assert (whole.whole_steps, whole.failure, whole.reason) == (67, "", "")  # the first step, and the 23rd, split
    # the fit's end says what compile did
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("FusedLightningModule: compile=")]
    assert said == [f"FusedLightningModule: {compiled.compile_report}."]
    assert compiled.compile_report.startswith("compile=True: 67 training steps ran whole")
    _assert_same_training(compiled, eager, 1e-5)


def test_under_compile_auto_keeps_a_lone_trial_on_its_compiled_fused_step_and_it_trains_as_alone():
    # eagerly a lone trial runs on its own module (the loop: nothing to batch); under compile the loop runs eagerly,
    # and the lone trial's compiled whole step is faster (docs/fused.md): auto keeps the fused backend, from the start
    # and when early stopping leaves one trial
    trial = _trials("adam", lrs=(0.05,))[0]
    alone = train_separately([trial], fit_digits, max_steps=12, limit_val_batches=0)[0]
    lone = _fit([trial], True, backend="auto")
    assert (lone.backend, lone._training_step.whole.whole_steps) == ("vmap", 11)
    assert max_state_difference(lone.unfuse(0), alone) <= 1e-5

    eager = _fit(_trials("adam", lrs=(0.05, 0.1)), False, steps=16, backend="auto", callbacks=[StopTrialAt(6)])
    assert eager.backend == "loop"
    compiled = _fit(_trials("adam", lrs=(0.05, 0.1)), True, steps=16, backend="auto", callbacks=[StopTrialAt(6)])
    assert (compiled.trial_ids, compiled.backend) == ([0], "vmap")
    whole = compiled._training_step.whole
    # 5 of the first 6 steps whole; after the stop, a split step learns the new update's parameters, then 9 whole
    assert (whole.whole_steps, whole.failure) == (14, "")
    _assert_same_training(compiled, eager, 1e-5)


class _BatchNormNet(L.LightningModule):
    """The template's SimpleDenseNet (Linear-BatchNorm1d-ReLU blocks) on the 8x8 digits, Adam, no torchmetrics."""

    def __init__(self, lr: float) -> None:
        super().__init__()
        from lightning_hydro.demos.template_mnist import SimpleDenseNet

        self.lr = lr
        self.net = SimpleDenseNet(input_size=64, lin1_size=32, lin2_size=32, lin3_size=16)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


@pytest.mark.slow
def test_a_batchnorm_network_runs_whole_its_running_statistics_updated_in_the_compiled_step():
    def trials() -> list[L.LightningModule]:
        return [seeded(lambda lr=lr: _BatchNormNet(lr), [i])[0] for i, lr in enumerate((1e-3, 3e-3, 1e-2))]

    eager, compiled = _fit(trials(), False), _fit(trials(), True)
    whole = compiled._training_step.whole
    assert whole.whole_steps == 11, whole.reason
    # the biases that feed BatchNorm take rounding-noise gradients, which Adam turns into lr-sized steps of either
    # sign: the whole step's checks leave those elements out, so they do not take them for a miscompilation
    assert (whole.checks, whole.failure) == (3, "")
    for tid in eager.results:
        assert compiled.results[tid]["steps"] == eager.results[tid]["steps"] == 12
        # the running statistics and every weight but the biases feeding BatchNorm (their gradient is rounding noise)
        assert learned_state_difference(compiled.unfuse(tid), eager.unfuse(tid)) <= 1e-5
        own, fused = compiled.unfuse(tid).net.model[1], eager.unfuse(tid).net.model[1]
        assert int(own.num_batches_tracked) == int(fused.num_batches_tracked) == 12
        assert torch.allclose(own.running_var, fused.running_var, rtol=1e-5)


@pytest.mark.slow
def test_under_bf16_mixed_the_split_steps_check_takes_float_rounding_for_what_it_is():
    # inductor keeps float32 intermediates where eager rounds to bfloat16: a right compiled step is several percent
    # off eager (this network: 1.7x the float32-sized bound of 5e-2), which must not read as a miscompilation
    trials = [seeded(lambda lr=lr: _BatchNormNet(lr), [i])[0] for i, lr in enumerate((1e-3, 3e-3, 1e-2))]
    compiled = _fit(trials, True, steps=4, precision="bf16-mixed")
    step = compiled._training_step.policy.backend.compiled_step
    assert step is not None
    if step.failure.startswith("torch 2.11 cannot compile"):  # an internal assert in functorch's layers
        pytest.skip(f"this torch does not compile the step: {step.failure}")
    assert (step.checks, step.unchecked, step.failure) == (3, "", "")
    assert step.worst <= 0.5


@pytest.mark.slow
def test_an_attention_model_runs_whole_and_trains_as_the_eager_fit():
    # embedding with padding_idx, LayerNorm, causal multi-head attention: torch.func lays the attention projection's
    # gradient out with the trial dimension inside, which the update's in-place ops need row-major
    from tests.helpers import TinyAttentionLM, fit_plain, train_fused

    trials = [seeded(lambda lr=lr: TinyAttentionLM(lr=lr), [i])[0] for i, lr in enumerate([1e-3, 3e-3, 1e-2])]
    eager = train_fused(trials, fit_plain, fused_kwargs={"backend": "vmap"}, max_steps=8)
    compiled = train_fused(trials, fit_plain, fused_kwargs={"backend": "vmap", "compile": True}, max_steps=8)
    assert compiled._training_step.whole.whole_steps == 7, compiled._training_step.whole.reason
    _assert_same_training(compiled, eager, 1e-5)


class _LateHeadMLP(DigitsMLP):
    """From step ``start`` on, its loss also goes through an extra head (before, the head takes no gradient)."""

    def __init__(self, start: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start = start
        self.extra = torch.nn.Linear(64, 10)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        if self.global_step >= self.start:
            logits = logits + self.extra(x)
        return torch.nn.functional.cross_entropy(logits, y)


class _LateScaleMLP(_LateHeadMLP):
    """From step ``start`` on, its loss is doubled: another graph, the same parameters take gradients."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x) + 0 * self.extra(x), y)
        return loss * 2 if self.global_step >= self.start else loss


@pytest.mark.slow
@pytest.mark.parametrize("module", [_LateHeadMLP, _LateScaleMLP])
def test_a_python_branch_in_the_step_relearns_what_takes_gradients_and_trains_as_eager(module):
    # SGD with momentum and weight decay: a parameter without a gradient takes no step at all, one with a zero
    # gradient decays; the head the step reaches from step 6 on must not move before it, and must train after
    def trials() -> list[L.LightningModule]:
        return [
            seeded(lambda lr=lr: module(6, hidden_dim=16, lr=lr, momentum=0.9, weight_decay=0.01), [i])[0]
            for i, lr in enumerate((0.05, 0.1))
        ]

    eager, compiled = _fit(trials(), False), _fit(trials(), True)
    whole = compiled._training_step.whole
    # the step reads self.global_step: every value needs a graph of its own, and each is traced only after a split
    # step has relearned which parameters take gradients (so steps alternate, whole and split)
    _assert_same_training(compiled, eager, 1e-5)
    assert whole.whole_steps >= 3
    if module is _LateHeadMLP:  # step 7 (global_step 6) needed a new graph, ran split, and found the head
        assert whole.failure.startswith("the parameters that take gradients changed from step to step")
    else:
        assert whole.failure == ""


class _FreezeHeadAt(L.Callback):
    """Freezes the trials' heads after the given number of steps (as a fine-tuning callback would)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        if trainer.global_step == self.at:
            for tid in pl_module.trial_ids:
                pl_module.trial_module(tid).head.requires_grad_(False)
            for name, param in pl_module._group.params.items():
                if name.startswith("head."):
                    param.requires_grad_(False)


@pytest.mark.slow
def test_a_parameter_frozen_by_a_callback_stops_moving_as_in_the_eager_fit():
    # SGD with momentum and weight decay: a frozen head takes no gradient, so no step at all (a zero gradient in a
    # compiled step would go on decaying it)
    def trials() -> list[L.LightningModule]:
        return _trials("sgd", momentum=0.9, weight_decay=0.01)

    eager = _fit(trials(), False, callbacks=[_FreezeHeadAt(5)])
    compiled = _fit(trials(), True, callbacks=[_FreezeHeadAt(5)])
    _assert_same_training(compiled, eager, 1e-5)
    assert compiled._training_step.whole.whole_steps >= 4


def test_the_whole_step_pickles_without_its_compiled_function():
    # ddp_spawn pickles the fused module into each process
    import pickle

    fused = _fit(_trials("adam"), True, steps=2)
    whole = fused._training_step.whole
    assert whole._compiled is not None
    copy = pickle.loads(pickle.dumps(whole))
    assert copy._compiled is None
    assert copy.whole_steps == whole.whole_steps == 1


@pytest.mark.parametrize("optimizer", ["sgd", pytest.param("adamw", marks=pytest.mark.slow)])
def test_every_tensor_the_whole_step_updates_in_place_is_a_static_input_of_its_graph(optimizer, monkeypatch):
    """The condition for inductor to record the whole step as a CUDA graph ("reduce-overhead"), checked on the CPU.

    Cudagraph trees replay a graph only if every input it writes is static (parameters, state, factors: never
    reallocated); else they skip it ("skipping cudagraphs due to mutated inputs", seen on an H200 with AdamW).
    Here all of the graph's inputs were non-static: the update's factor views, inputs that alias the table the step
    writes, made AOTAutograd merge them into a synthetic base and drop the static inputs.
    """
    import inspect

    import torch._inductor.output_code as output_code

    graphs: list[tuple[set[int], set[int]]] = []  # the whole step's: (mutated inputs, static inputs)
    inside: list[bool] = []
    real_init = output_code.CompiledFxGraph.__init__
    signature = inspect.signature(real_init)

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        if inside:
            static = signature.bind(self, *args, **kwargs).arguments.get("static_input_idxs") or ()
            graphs.append((set(self.mutated_input_idxs), set(static)))

    real_compile = whole_step.compile_whole_step

    def tagged(setting: Any) -> Any:
        compiled = real_compile(setting)

        def call(*args: Any) -> Any:
            inside.append(True)
            try:
                return compiled(*args)
            finally:
                inside.pop()

        return call

    monkeypatch.setattr(output_code.CompiledFxGraph, "__init__", init)
    monkeypatch.setattr(whole_step, "compile_whole_step", tagged)
    with torch._inductor.config.patch(force_disable_caches=True):  # a cached graph is loaded, not built
        fused = _fit(
            _trials(optimizer, momentum=0.9) if optimizer == "sgd" else _trials(optimizer), "reduce-overhead", steps=3
        )
    assert fused._training_step.whole.whole_steps == 2
    assert graphs, "no graph of the whole step was built"
    for mutated, static in graphs:
        assert mutated  # the parameters and the optimizer state, updated in place
        assert mutated <= static, sorted(mutated - static)
