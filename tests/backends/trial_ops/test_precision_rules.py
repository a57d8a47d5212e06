"""Each op under the fused vmap step computes at the dtypes of the unfused call, in every precision (issue 20, item 2).

vmap's own batching splits ops (an affine step after a normalisation, a bias after a matmul or convolution) and
hands autocast the pieces, whose policies differ from the op's own: without the trial rules, under bf16 autocast
on CPU, a ``conv2d`` ran in float32 and a ``cross_entropy`` in bfloat16, normalisation layers returned float32,
and batch norm with running statistics raised ``expected scalar type BFloat16 but found Float``. On the CPU
(``tests/gpu/test_gpu_precision.py`` runs the same cases on CUDA).
"""

from __future__ import annotations

import pytest
import torch

from tests.trial_op_cases import CASES, PRECISIONS, gradients, run, tolerance


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", list(CASES))
def test_each_op_computes_for_every_trial_what_it_computes_for_one(name, precision):
    fused, fused_tensors = run(name, precision, fused=True)
    alone, alone_tensors = run(name, precision, fused=False)
    assert fused.dtype == alone.dtype, f"{name} under {precision}: fused {fused.dtype}, alone {alone.dtype}"
    torch.testing.assert_close(fused, alone, **tolerance(alone.dtype))
    for after_fused, after_alone in zip(fused_tensors, alone_tensors):  # batch norm's running statistics
        torch.testing.assert_close(after_fused, after_alone, **tolerance(after_alone.dtype))


@pytest.mark.parametrize("name", list(CASES))
def test_each_op_differentiates_for_every_trial_as_for_one(name):
    for got, expected in zip(gradients(name, fused=True), gradients(name, fused=False)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
