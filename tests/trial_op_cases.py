"""Single ops under the fused vmap step and for each trial alone, in every precision (shared by the op tests).

Each case: a step (the op as user code calls it), its tensors (parameters per trial ``[B, ...]``, inputs mostly
shared) and vmap's ``in_dims``. :func:`run` runs it fused (vmap with the trial rules) or per trial, stacked.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import vmap

from lightning_hydro.backends.trial_ops.functional_patch import trial_functional

TRIALS = 3
# bf16-autocast: float32 tensors under autocast; bf16-autocast, bf16 input: the same, but the op's input comes in
# bfloat16, as an activation does from the op before it under bf16-mixed (parameters and statistics stay float32)
PRECISIONS = ["float32", "bf16-autocast", "bf16-autocast, bf16 input", "bfloat16", "float16"]


def r(*shape: int) -> Tensor:
    return torch.randn(*shape)


# name -> (step, per-trial tensors [B, ...] or shared tensors, in_dims); parameters are per trial, inputs mostly shared
CASES: dict[str, Callable[[], tuple[Callable[..., Tensor], list[Tensor], tuple[int | None, ...]]]] = {
    "linear, shared input": lambda: (
        lambda x, w, b: F.linear(x, w, b),
        [r(8, 6), r(TRIALS, 5, 6), r(TRIALS, 5)],
        (None, 0, 0),
    ),
    "linear, per-trial input": lambda: (
        lambda x, w, b: F.linear(x, w, b),
        [r(TRIALS, 8, 6), r(TRIALS, 5, 6), r(TRIALS, 5)],
        (0, 0, 0),
    ),
    "conv2d, shared input": lambda: (
        lambda x, w, b: F.conv2d(x, w, b, padding=1),
        [r(4, 3, 6, 6), r(TRIALS, 5, 3, 3, 3), r(TRIALS, 5)],
        (None, 0, 0),
    ),
    "conv2d, per-trial input, groups": lambda: (
        lambda x, w, b: F.conv2d(x, w, b, groups=2),
        [r(TRIALS, 4, 4, 6, 6), r(TRIALS, 6, 2, 3, 3), r(TRIALS, 6)],
        (0, 0, 0),
    ),
    "conv1d": lambda: (lambda x, w: F.conv1d(x, w), [r(4, 3, 9), r(TRIALS, 5, 3, 3)], (None, 0)),
    "conv_transpose2d": lambda: (
        lambda x, w: F.conv_transpose2d(x, w),
        [r(TRIALS, 4, 3, 5, 5), r(TRIALS, 3, 2, 3, 3)],
        (0, 0),
    ),
    "batch_norm, training": lambda: (
        lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, training=True),
        [r(TRIALS, 8, 4, 5, 5), r(TRIALS, 4), r(TRIALS, 4), torch.zeros(TRIALS, 4), torch.ones(TRIALS, 4)],
        (0, 0, 0, 0, 0),
    ),
    "batch_norm, eval": lambda: (
        lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, training=False),
        [r(TRIALS, 8, 4, 5, 5), r(TRIALS, 4), r(TRIALS, 4), r(TRIALS, 4), torch.rand(TRIALS, 4) + 0.5],
        (0, 0, 0, 0, 0),
    ),
    "batch_norm, no running statistics": lambda: (
        lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
        [r(TRIALS, 8, 4), r(TRIALS, 4), r(TRIALS, 4)],
        (0, 0, 0),
    ),
    "group_norm": lambda: (
        lambda x, w, b: F.group_norm(x, 2, w, b),
        [r(TRIALS, 8, 4, 5, 5), r(TRIALS, 4), r(TRIALS, 4)],
        (0, 0, 0),
    ),
    "layer_norm, per-trial input": lambda: (
        lambda x, w, b: F.layer_norm(x, (6,), w, b),
        [r(TRIALS, 8, 6), r(TRIALS, 6), r(TRIALS, 6)],
        (0, 0, 0),
    ),
    "layer_norm, shared input": lambda: (
        lambda x, w, b: F.layer_norm(x, (3, 6), w, b),
        [r(8, 3, 6), r(TRIALS, 3, 6), r(TRIALS, 3, 6)],
        (None, 0, 0),
    ),
    "cross_entropy": lambda: (
        lambda z: F.cross_entropy(z, torch.arange(8, device=z.device) % 5, label_smoothing=0.1),
        [r(TRIALS, 8, 5)],
        (0,),
    ),
    "mse_loss": lambda: (lambda z: F.mse_loss(z, torch.ones_like(z)), [r(TRIALS, 8, 5)], (0,)),
    "scaled_dot_product_attention": lambda: (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        [r(TRIALS, 2, 2, 5, 8), r(TRIALS, 2, 2, 5, 8), r(TRIALS, 2, 2, 5, 8)],
        (0, 0, 0),
    ),
}


def in_precision(tensors: list[Tensor], precision: str, device: str) -> tuple[list[Tensor], Any]:
    """The tensors as the precision holds them on ``device``, and the context it runs the op in."""
    tensors = [t.to(device) for t in tensors]
    if precision == "bf16-autocast":
        return tensors, torch.autocast(device, dtype=torch.bfloat16)
    if precision == "bf16-autocast, bf16 input":
        return [tensors[0].bfloat16(), *tensors[1:]], torch.autocast(device, dtype=torch.bfloat16)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[precision]
    return [t.to(dtype) for t in tensors], nullcontext()


def run(name: str, precision: str, *, fused: bool, device: str = "cpu") -> tuple[Tensor, list[Tensor]]:
    """The op's output for every trial (stacked) and its tensors afterwards (running statistics updated)."""
    torch.manual_seed(0)
    step, tensors, in_dims = CASES[name]()
    tensors, context = in_precision(tensors, precision, device)
    with context:
        if fused:
            with trial_functional():
                out = vmap(step, in_dims=in_dims)(*tensors)
        else:
            rows = [[t if d is None else t.select(d, row) for t, d in zip(tensors, in_dims)] for row in range(TRIALS)]
            out = torch.stack([step(*row) for row in rows])
    return out, tensors


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """float32: rounding; half precision: two units in the last place (an accumulation order apart, rounded)."""
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": 1e-5}
    eps = torch.finfo(dtype).eps
    return {"rtol": 2 * eps, "atol": 2 * eps}


def gradients(name: str, *, fused: bool, device: str = "cpu") -> list[Tensor]:
    """float32 gradients of a weighted sum of the op's output with respect to its first three tensors."""
    torch.manual_seed(0)
    step, tensors, in_dims = CASES[name]()
    leaves = [t.to(device) for t in tensors]
    leaves = [t.requires_grad_() if t.is_floating_point() and i < 3 else t for i, t in enumerate(leaves)]
    if fused:
        with trial_functional():
            out = vmap(step, in_dims=in_dims)(*leaves)
    else:
        rows = [[t if d is None else t.select(d, row) for t, d in zip(leaves, in_dims)] for row in range(TRIALS)]
        out = torch.stack([step(*row) for row in rows])
    weights = torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)
    return list(torch.autograd.grad((out * weights).sum(), [t for t in leaves if t.requires_grad]))
