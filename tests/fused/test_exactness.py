"""Fused training must equal separately trained trials, parameter for parameter (issue: exactness)."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_hydro.demos import DigitsMLP
from tests.helpers import (
    DigitsCNN,
    TiedAttentionLM,
    TinyAttentionLM,
    TorchEncoderLM,
    fit_digits,
    fit_plain,
    max_state_difference,
    mixed_optimizer_mlps,
    seeded,
    train_fused,
    train_separately,
)

BACKENDS = ["vmap", "hfta", "loop"]


def assert_trials_match(fused, separate, tolerance: float) -> None:
    for tid, module in enumerate(separate):
        assert max_state_difference(fused.unfuse(tid), module) <= tolerance, f"trial {tid}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_mlp_with_sgd_adam_adamw_matches_separate_training(backend):
    trials = mixed_optimizer_mlps()
    separate = train_separately(trials, fit_digits, max_steps=50)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": backend}, max_steps=50)
    assert fused._optimizer.active_path == "universal"  # mixed classes: each trial's own optimizer
    assert_trials_match(fused, separate, 1e-5)
    assert [fused.results[t]["steps"] for t in range(4)] == [50] * 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_boring_model_unchanged_matches_separate_training(backend):
    trials = seeded(BoringModel, seeds=range(3))
    separate = train_separately(trials, fit_plain, max_steps=50)
    fused = train_fused(trials, fit_plain, fused_kwargs={"backend": backend}, max_steps=50)
    assert_trials_match(fused, separate, 1e-5)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_fused_optimizer_path_gives_the_same_numbers(optimizer):
    lrs = [0.05, 0.1, 0.02] if optimizer == "sgd" else [1e-3, 3e-3, 1e-2]
    trials = [
        seeded(lambda lr=lr, i=i: DigitsMLP(hidden_dim=32, lr=lr, optimizer=optimizer, weight_decay=0.01 * i), [i])[0]
        for i, lr in enumerate(lrs)
    ]
    separate = train_separately(trials, fit_digits, max_steps=50)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "vmap", "optimizer_path": "fused"}, max_steps=50)
    assert fused._optimizer.active_path == "fused"
    assert_trials_match(fused, separate, 1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cnn_with_batchnorm_has_per_trial_running_stats(backend):
    trials = [seeded(lambda lr=lr: DigitsCNN(lr=lr), [i])[0] for i, lr in enumerate([0.02, 0.05, 0.1])]
    separate = train_separately(trials, fit_digits, max_steps=50)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": backend}, max_steps=50)
    assert_trials_match(fused, separate, 1e-4)
    means = fused.stacked.get_buffer("features__1__running_mean")
    assert not torch.allclose(means[0], means[1])  # the statistics really are per trial


@pytest.mark.parametrize("model", [TinyAttentionLM, TiedAttentionLM])
@pytest.mark.parametrize("backend", BACKENDS)
def test_embedding_layernorm_attention_model_matches(backend, model):
    trials = [seeded(lambda lr=lr: model(lr=lr), [i])[0] for i, lr in enumerate([1e-3, 3e-3, 1e-2])]
    separate = train_separately(trials, fit_plain, max_steps=30)
    fused = train_fused(trials, fit_plain, fused_kwargs={"backend": backend}, max_steps=30)
    assert_trials_match(fused, separate, 1e-4)
    if model is TiedAttentionLM:  # one tensor under two names (vmap's functional_call must tie it): still one
        for tid in range(3):
            trial = fused.unfuse(tid)
            assert trial.readout.weight is trial.embed.weight


def test_gradient_accumulation_matches_separate_training():
    trials = mixed_optimizer_mlps()[:2]
    separate = train_separately(trials, fit_digits, max_steps=20, accumulate_grad_batches=3)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "vmap"}, max_steps=20, accumulate_grad_batches=3)
    assert_trials_match(fused, separate, 1e-5)
    assert fused.results[0]["steps"] == 20


def test_dropout_masks_are_independent_per_trial():
    torch.manual_seed(0)
    template = DigitsMLP(hidden_dim=32, dropout=0.5, lr=0.1)
    trials = [template] + [seeded(lambda: DigitsMLP(hidden_dim=32, dropout=0.5, lr=0.1), [0])[0] for _ in range(2)]
    for t in trials[1:]:
        t.load_state_dict(template.state_dict())  # identical trials: only the dropout masks can differ
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "vmap"}, max_steps=3)
    weights = [fused.unfuse(t).head.weight for t in range(3)]
    assert not torch.allclose(weights[0], weights[1])
    assert not torch.allclose(weights[1], weights[2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_transformer_encoder_with_padding_and_causal_masks(backend):
    trials = [seeded(lambda lr=lr: TorchEncoderLM(lr=lr), [i])[0] for i, lr in enumerate([0.01, 0.03])]
    separate = train_separately(trials, fit_plain, max_steps=15)
    fused = train_fused(trials, fit_plain, fused_kwargs={"backend": backend}, max_steps=15)
    assert_trials_match(fused, separate, 1e-4)
