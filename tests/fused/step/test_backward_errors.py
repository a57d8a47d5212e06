"""A fused step whose backward pass fails is a FusionError naming the op and the user's line (issue 20, item 1).

On CUDA, vmap's own batching of attention failed in the backward pass (``LSE is not correctly aligned
(strideH)``), outside the step's forward, where the user's line cannot be read from the traceback. The
first-batch check runs the fused backward; when it fails, the step is rerun under anomaly detection, which
records where each backward node was created. The failing kernel is simulated here by an op whose backward
raises that message.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightning_hydro import FusedLightningModule, FusionError
from lightning_hydro.demos import DigitsMLP
from tests.helpers import fit_digits, make_trainer


class RefusedBackward(torch.autograd.Function):
    """Identity whose backward raises what CUDA's memory-efficient attention raised under vmap."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("LSE is not correctly aligned (strideH)")


class RefusingMLP(DigitsMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return RefusedBackward.apply(super().forward(x))  # the line the error names


def test_a_backward_pass_that_fails_under_vmap_names_the_op_and_the_users_line():
    fused = FusedLightningModule([RefusingMLP(hidden_dim=8), RefusingMLP(hidden_dim=8)], backend="vmap")
    with pytest.raises(FusionError, match=r"backend='vmap' cannot differentiate RefusingMLP.training_step") as info:
        fit_digits(make_trainer(max_steps=1), fused)
    message = str(info.value)
    assert "failed (LSE is not correctly aligned (strideH))" in message
    assert "the backward of" in message
    assert "Backward" in message
    assert "test_backward_errors.py:" in message
    assert "return RefusedBackward.apply(super().forward(x))" in message
    assert "Use backend='hfta' or 'loop'" in message


def test_the_advice_names_the_backends_other_than_the_one_that_failed():
    # before, hfta's refusal advised "Use backend='hfta' or 'loop'"
    fused = FusedLightningModule([RefusingMLP(hidden_dim=8), RefusingMLP(hidden_dim=8)], backend="hfta")
    with pytest.raises(FusionError, match=r"backend='hfta' cannot differentiate") as info:
        fit_digits(make_trainer(max_steps=1), fused)
    assert "Use backend='vmap' or 'loop'" in str(info.value)
