"""Every precision on every backend: fused trials equal trials trained alone within the precision's own spread.

Issue 20, item 2. A BatchNorm CNN, a GroupNorm CNN and a LayerNorm MLP train 3 steps (SGD with momentum; each
trial's own optimizer, ``optimizer_path="universal"``) under ``bf16-mixed``, ``bf16-true`` and ``16-true`` on
the CPU (``accelerator="cpu"``, pinned; ``tests/gpu/`` runs the same on CUDA). The measure is the largest
relative difference over a trial's parameters and buffers. The spread is what the precision itself makes of the
same training: the largest difference between a trial trained alone and the same trial trained alone on the
same batches with their samples in another order (2 orders), which sums every batch reduction otherwise.

Before the trial rules, ``bf16-mixed`` with BatchNorm failed on hfta (``mixed dtype (CPU): expect parameter to
have scalar type of Float``) and vmap ran convolutions in float32 and the loss in bfloat16 (2x the spread).
"""

from __future__ import annotations

import copy
import functools

import lightning as L
import pytest
import torch

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule
from tests.fusion_models import NormNet, PermutedDigits
from tests.helpers import make_trainer, max_state_difference

PRECISIONS = ["bf16-mixed", "bf16-true", "16-true"]
NORMS = ["batch", "group", "layer"]
STEPS = 3
ORDERS = (1, 2)


def trials(norm: str) -> list[NormNet]:
    modules = []
    for seed, lr in enumerate((0.05, 0.1)):
        torch.manual_seed(seed)
        modules.append(NormNet(norm, lr=lr))  # type: ignore[arg-type]
    return modules


def fit(module: L.LightningModule, precision: str, order: int | None = None) -> L.LightningModule:
    torch.manual_seed(1234)
    data = DigitsDataModule(batch_size=64) if order is None else PermutedDigits(order, batch_size=64)
    make_trainer(max_steps=STEPS, limit_val_batches=0, precision=precision).fit(module, datamodule=data)
    return module


@functools.cache
def alone(norm: str, precision: str) -> tuple[list[L.LightningModule], float]:
    """Each trial trained alone, and the precision's spread: the largest difference across sample orders."""
    separate = [fit(copy.deepcopy(m), precision) for m in trials(norm)]
    spread = max(
        max_state_difference(fit(copy.deepcopy(m), precision, order), own)
        for order in ORDERS
        for m, own in zip(trials(norm), separate)
    )
    return separate, spread


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop"])
def test_fused_trials_equal_trials_alone_within_the_precisions_spread(backend, norm, precision):
    separate, spread = alone(norm, precision)
    fused = FusedLightningModule(
        [copy.deepcopy(m) for m in trials(norm)], backend=backend, optimizer_path="universal", summary=False
    )
    fit(fused, precision)
    differences = [max_state_difference(fused.unfuse(tid), own) for tid, own in enumerate(separate)]
    print(f"{precision} {norm} on {backend}: fused vs alone {differences}, spread {spread:.3e}")
    assert all(fused.results[tid]["steps"] == STEPS for tid in (0, 1))
    assert max(differences) <= spread, (differences, spread)
    if backend == "loop":  # each trial's own module and optimizer: exactly the separate run
        assert max(differences) == 0.0


def test_auto_under_bf16_mixed_runs_a_batchnorm_group_within_the_spread():
    separate, spread = alone("batch", "bf16-mixed")
    fused = FusedLightningModule([copy.deepcopy(m) for m in trials("batch")], optimizer_path="universal", summary=False)
    fit(fused, "bf16-mixed")
    assert "skipped" not in fused.backend_report  # every backend runs it; auto picked the fastest
    assert max(max_state_difference(fused.unfuse(tid), own) for tid, own in enumerate(separate)) <= spread
