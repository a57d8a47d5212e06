"""Per-trial gradient clipping on stacked gradients: each trial clipped by its own norm.

Clipping the stacked gradients by one global norm would couple the trials (one trial's large gradient
would shrink every other trial's step). Here row b is scaled exactly as ``clip_grad_norm_`` would scale
trial b's gradients if it trained alone.

Example::

    >>> import torch
    >>> p = torch.nn.Parameter(torch.zeros(2, 3))
    >>> p.grad = torch.tensor([[3.0, 4.0, 0.0], [0.3, 0.4, 0.0]])
    >>> norms = clip_grad_norm_per_trial([p], max_norm=1.0)
    >>> [round(n, 3) for n in norms.tolist()], [round(x, 3) for x in p.grad[0].tolist()]
    ([5.0, 0.5], [0.6, 0.8, 0.0])
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

__all__ = ["clip_grad_norm_per_trial", "clip_grad_value_per_trial"]


@torch.no_grad()
def clip_grad_norm_per_trial(params: Iterable[nn.Parameter], max_norm: float, norm_type: float = 2.0) -> Tensor:
    """Scale each row of the stacked gradients so that the trial's total gradient norm is <= ``max_norm``.

    Returns:
        The ``[B]`` total gradient norms before clipping.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(0)
    per_param = torch.stack([torch.linalg.vector_norm(g.flatten(1), norm_type, dim=1) for g in grads])
    total = torch.linalg.vector_norm(per_param, norm_type, dim=0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_mul_(grads, [_row_factor(coef, g) for g in grads])  # torch.nn.utils' foreach kernels do this too
    return total


def _row_factor(coef: Tensor, grad: Tensor) -> Tensor:
    """``[B]`` per-row factors shaped ``[B, 1, ...]`` to scale ``grad`` (in its dtype)."""
    coef = coef if coef.dtype == grad.dtype else coef.to(grad.dtype)
    return coef.view(-1, *([1] * (grad.dim() - 1)))


@torch.no_grad()
def clip_grad_value_per_trial(params: Iterable[nn.Parameter], clip_value: float) -> None:
    """Clamp every gradient element to ``[-clip_value, clip_value]`` (elementwise, so trivially per trial)."""
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        torch._foreach_clamp_min_(grads, -clip_value)
        torch._foreach_clamp_max_(grads, clip_value)
