"""Mixed and half precision on CUDA, on every backend (issue 20, items 2 and 5).

Before the trial rules: ``RuntimeError: Expected running_mean to have type BFloat16 but got Float`` with
``bf16-mixed`` and BatchNorm on vmap (H100, torch 2.11).
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from lightning_hydro import FusedLightningModule
from tests.fusion_models import Norm, alone_and_spread, fit_norm_net, norm_trials
from tests.helpers import max_state_difference
from tests.trial_op_cases import CASES, PRECISIONS, gradients, run, tolerance

pytestmark = pytest.mark.gpu

STEPS = 3


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", list(CASES))
def test_each_op_computes_for_every_trial_on_cuda_what_it_computes_for_one(name, precision):
    fused, fused_tensors = run(name, precision, fused=True, device="cuda")
    alone, alone_tensors = run(name, precision, fused=False, device="cuda")
    assert fused.dtype == alone.dtype, f"{name} under {precision}: fused {fused.dtype}, alone {alone.dtype}"
    torch.testing.assert_close(fused, alone, **tolerance(alone.dtype))
    for after_fused, after_alone in zip(fused_tensors, alone_tensors):
        torch.testing.assert_close(after_fused, after_alone, **tolerance(after_alone.dtype))


@pytest.mark.parametrize("name", list(CASES))
def test_each_op_differentiates_for_every_trial_on_cuda_as_for_one(name):
    for got, expected in zip(gradients(name, fused=True, device="cuda"), gradients(name, fused=False, device="cuda")):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@functools.cache
def alone(norm: Norm, precision: str) -> tuple[list, float]:
    return alone_and_spread(norm, precision, STEPS, (1, 2), accelerator="gpu")


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true", "16-true"])
@pytest.mark.parametrize("norm", ["batch", "group", "layer"])
@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop"])
def test_fused_trials_on_cuda_equal_trials_alone_within_the_precisions_spread(backend, norm, precision):
    separate, spread = alone(norm, precision)
    fused = FusedLightningModule(
        [copy.deepcopy(m) for m in norm_trials(norm)], backend=backend, optimizer_path="universal", summary=False
    )
    fit_norm_net(fused, precision, STEPS, accelerator="gpu")
    differences = [max_state_difference(fused.unfuse(tid), own) for tid, own in enumerate(separate)]
    print(f"CUDA {precision} {norm} on {backend}: fused vs alone {differences}, spread {spread:.3e}")
    assert max(differences) <= spread, (differences, spread)
