"""The GPU suite (``pytest -m gpu``, ``nox -s gpu``): every test here needs CUDA and runs with TF32 off.

TF32 (cuDNN's default for convolutions) rounds each product to 10 mantissa bits: one ResNet-18 step's gradients
differ by ~9e-2 between TF32 on and off, for one unfused module as for fused trials (issue 20). "Equal to
separate training" is therefore checked with TF32 off, in float32, or at matched half precision against the
precision's own spread (docs/fused.md, "On a GPU").
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _float32_without_tf32():
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
