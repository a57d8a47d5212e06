"""Transformer trials fuse on vmap: torch's attention modules and raw SDPA match separate training (issue 20, item 1).

First-step gradients of each fused trial against the same trial trained alone, relative over all its parameters,
fp32 on CPU (``accelerator="cpu"``, pinned: ``tests/gpu/`` checks every CUDA kernel). Before the trial rules, vmap
ran CPU attention through its per-trial fallback loop (a "performance drop" warning, failed here) and, on CUDA,
raised ``LSE is not correctly aligned (strideH)`` in the backward pass.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import lightning as L
import pytest
import torch

from lightning_hydro import FusedLightningModule
from tests.fusion_models import AttentionLM, fused_and_separate_first_gradients
from tests.helpers import make_trainer

KINDS = ["mha", "encoder_mask", "encoder_is_causal", "sdpa_float_mask", "sdpa_bool_mask", "sdpa_is_causal"]


def fit_plain(trainer: L.Trainer, module: L.LightningModule) -> None:
    trainer.fit(module)


def trials(kind: str, **kwargs: Any) -> list[AttentionLM]:
    modules = []
    for seed, lr in enumerate((1e-3, 3e-3)):
        torch.manual_seed(seed)
        modules.append(AttentionLM(kind, lr=lr, **kwargs))  # type: ignore[arg-type]
    return modules


@pytest.mark.parametrize("kind", KINDS)
def test_first_step_gradients_of_attention_trials_on_vmap_equal_separate_training(kind):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        errors = fused_and_separate_first_gradients(trials(kind), fit_plain, backend="vmap")
    print(f"{kind} on vmap: relative first-step gradient errors {errors}")
    assert max(errors) <= 1e-5, errors
    fallbacks = [str(w.message) for w in caught if "performance drop" in str(w.message)]
    assert not fallbacks, fallbacks[0]  # every trial attends in one kernel call, not in vmap's per-trial loop


@pytest.mark.parametrize("backend", ["hfta", "loop"])
@pytest.mark.parametrize("kind", ["mha", "encoder_is_causal", "sdpa_float_mask"])
def test_first_step_gradients_of_attention_trials_on_the_other_backends_equal_separate_training(kind, backend):
    errors = fused_and_separate_first_gradients(trials(kind), fit_plain, backend=backend)
    assert max(errors) <= 1e-5, (backend, errors)


@pytest.mark.parametrize("kind", ["mha", "encoder_is_causal", "sdpa_is_causal"])
def test_attention_dropout_trains_fused_with_independent_masks_per_trial(kind):
    group = trials(kind, dropout=0.5)
    group[1].load_state_dict(group[0].state_dict())  # identical trials: only their dropout masks can differ
    fused = FusedLightningModule([copy.deepcopy(m) for m in group], backend="vmap", summary=False)
    torch.manual_seed(0)
    make_trainer(max_steps=2, limit_val_batches=0).fit(fused)
    first, second = fused.unfuse(0), fused.unfuse(1)
    assert fused.results[0]["steps"] == fused.results[1]["steps"] == 2
    assert any(not torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
