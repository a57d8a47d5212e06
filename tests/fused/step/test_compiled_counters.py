"""compile=: a step that reads ``batch_idx``, ``self.global_step`` or ``self.current_epoch`` keeps compiling.

Lightning's docs and published modules branch on these counters in their steps (``if batch_idx % 100 == 0``).
Specialised, each value needed a graph of its own, and after 8 the step ran eagerly for the rest of the fit.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends.compiled_step import StepCompiler, raised_compiling
from lightning_hydro.demos import DigitsMLP
from tests.helpers import StopTrialAt, fit_digits, make_trainer, max_state_difference, seeded


class _CountingMLP(DigitsMLP):
    """Logs a sample every 4th batch, weighs every 3rd optimizer step's loss 1.5x, and doubles it from epoch 1."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        if batch_idx % 4 == 0:
            self.log("train/sampled", loss, on_step=False, on_epoch=True)
        if self.global_step % 3 == 0:
            loss = loss * 1.5
        if self.current_epoch >= 1:
            loss = loss * 2
        self.log("train/loss", loss, on_step=False, on_epoch=True)
        return loss


class _WarmupMLP(DigitsMLP):
    """Scales its loss by a warm-up factor made from ``self.global_step`` (a float from an int)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y) * min(1.0, (self.global_step + 1) / 10)


_NEW_GRAPH = "the step needs a new graph: a split step learns which parameters take gradients first"


def _fit(module: type[DigitsMLP], compile: bool, steps: int, stop_at: int | None = None) -> FusedLightningModule:
    trials = [
        seeded(lambda lr=lr: module(hidden_dim=16, lr=lr, momentum=0.9), [i])[0]  # type: ignore[misc]
        for i, lr in enumerate((0.05, 0.1, 0.02))
    ]
    fused = FusedLightningModule(trials, backend="vmap", compile=compile, summary=False)
    callbacks = [] if stop_at is None else [StopTrialAt(stop_at)]
    trainer = make_trainer(max_steps=steps, limit_val_batches=0, callbacks=callbacks)
    fit_digits(trainer, fused)
    return fused


@pytest.mark.slow
def test_a_step_with_more_paths_than_dynamos_eight_graphs_keeps_running_whole():
    # its branches' paths (4 in epoch 0, 4 more in epoch 1), the short last batch, for each of two group sizes: more
    # graphs than dynamo's default limit of 8, which made every later step split, then eager (checked)
    eager, compiled = _fit(_CountingMLP, False, 50, stop_at=12), _fit(_CountingMLP, True, 50, stop_at=12)
    assert compiled.results[1]["steps"] == 12
    whole = compiled._training_step.whole
    assert whole.failure == ""
    assert compiled._policy.backend.compile_failure == ""
    assert whole.whole_steps >= 26  # 34 on this CPU; with dynamo's limit of 8 graphs the step fell back to eager
    assert whole.reason in ("", _NEW_GRAPH)
    _assert_same_training(compiled, eager)


def _assert_same_training(compiled: FusedLightningModule, eager: FusedLightningModule) -> None:
    for tid in eager.results:
        assert compiled.results[tid]["steps"] == eager.results[tid]["steps"]
        assert max_state_difference(compiled.unfuse(tid), eager.unfuse(tid)) <= 1e-5, tid


@pytest.mark.slow
def test_a_step_that_branches_on_the_counters_runs_whole_past_eight_values_and_trains_as_eager():
    # 26 steps: two epochs of the digits (22 batches of 64 an epoch, the last one short), batch_idx and global_step
    # take 26 values; a graph each would have hit dynamo's limit of 8 at the 9th step, and run eagerly after
    eager, compiled = _fit(_CountingMLP, False, 26), _fit(_CountingMLP, True, 26)
    whole = compiled._training_step.whole
    assert whole.failure == ""
    assert compiled._policy.backend.compile_failure == ""
    # the other steps ran split: the first, and one before each new graph (the branches' combinations, the short
    # batch, each counter's first change); specialised, at most 8 steps could run whole, and the last ones eagerly
    assert whole.whole_steps >= 14
    assert whole.reason in ("", _NEW_GRAPH)  # still compiling at the end (a new path runs split first)
    _assert_same_training(compiled, eager)
    # each epoch's mean of what the branches logged, per trial
    logged_eager, logged_compiled = eager.training_epoch_values(), compiled.training_epoch_values()
    for tid in eager.results:
        assert set(logged_eager[tid]) == {"train/sampled", "train/loss"}
        assert logged_compiled[tid] == pytest.approx(logged_eager[tid], abs=1e-5)


@pytest.mark.slow
def test_a_step_whose_symbolic_counter_does_not_compile_compiles_it_specialised_and_trains_as_eager(caplog):
    # inductor fails on the warm-up factor made symbolic (torch 2.11-2.14); specialised, it compiles a graph per
    # value (8 at most) before the step runs eagerly: no fewer compiled steps than before counters were symbolic
    eager = _fit(_WarmupMLP, False, 14)
    with caplog.at_level(logging.INFO, logger="lightning_hydro"):
        compiled = _fit(_WarmupMLP, True, 14)
    _assert_same_training(compiled, eager)
    whole = compiled._training_step.whole
    specialised = [r for r in caplog.records if "with its ints specialised" in r.getMessage()]
    if specialised:
        assert whole.whole_steps >= 7, whole.reason  # a graph per value, each traced after a split step, as before
    else:  # a torch that compiles it symbolic: whole from the third step on
        assert whole.whole_steps >= 11, whole.reason


def test_a_function_that_does_not_compile_with_symbolic_ints_is_compiled_specialised(caplog):
    def scale(x: torch.Tensor, step: int) -> torch.Tensor:
        return x * (step + 1)

    def refuse(*args: Any) -> Any:
        raise torch._dynamo.exc.TorchDynamoException("symbolic ints are not supported here")

    compiler = StepCompiler(scale, None, "scale")
    compiler._compiled = refuse  # as if compiling with symbolic ints had failed
    x = torch.ones(3)
    with caplog.at_level(logging.INFO, logger="lightning_hydro"):
        assert torch.equal(compiler(x, 1), x * 2)
        assert torch.equal(compiler(x, 4), x * 5)  # the specialised function: a graph for this value too
    assert compiler.specialised == "TorchDynamoException: symbolic ints are not supported here"
    lines = [r.getMessage() for r in caplog.records if "with its ints specialised" in r.getMessage()]
    assert len(lines) == 1
    assert "compiles scale with its ints specialised" in lines[0]


def test_a_refused_recompile_is_the_callers_to_handle():
    # the whole step asks for no new graph with a "fail_on_recompile" stance (it must run split first): that refusal
    # is not a compile failure, and must not switch the function to specialised ints
    compiler = StepCompiler(lambda x: x * 2, None, "double")
    compiler(torch.ones(3))
    with torch.compiler.set_stance("fail_on_recompile"), pytest.raises(RuntimeError, match="Detected recompile"):
        compiler(torch.ones(4, 2))
    assert compiler.specialised == ""


def test_what_counts_as_a_compile_failure():
    compiler = StepCompiler(lambda x: x.view(-1, 5), None, "view")
    with pytest.raises(torch._dynamo.exc.TorchDynamoException, match="view") as raised:  # found while tracing
        compiler(torch.ones(3, 4))
    assert raised_compiling(raised.value)
    assert not raised_compiling(RuntimeError("CUDA out of memory"))
    # torch 2.11 raises a functorch error of its own while handling a backend's failure
    with pytest.raises(RuntimeError, match="dynamicLayerStack") as raised:
        _handle_a_backend_failure_as_torch_2_11_does()
    assert raised_compiling(raised.value)


def _handle_a_backend_failure_as_torch_2_11_does() -> None:
    try:
        raise torch._dynamo.exc.TorchDynamoException("backend failed")
    except torch._dynamo.exc.TorchDynamoException:
        raise RuntimeError("!dynamicLayerStack.empty() INTERNAL ASSERT FAILED") from None
