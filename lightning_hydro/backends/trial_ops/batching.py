"""Which arguments carry vmap's trial dimension, and bringing that dimension where a kernel batches.

torch.func offers no public test of whether a tensor is a vmap ``BatchedTensor``; the trial rules need one to
leave every call that vmap does not batch (the physical calls inside fused operators, other code run while a
fused step runs) exactly as it was. :func:`is_batched` is the one place that asks torch's functorch bindings.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = [
    "VmapOnlyFunction",
    "is_batched",
    "trials_first",
    "trials_first_or_shared",
    "trials_next_to_batch",
]


def is_batched(value: object) -> bool:
    """Whether ``value`` is a tensor that ``torch.func.vmap`` maps over (at any level).

    Example::

        >>> from torch.func import vmap
        >>> seen = []
        >>> _ = vmap(lambda row: seen.append(is_batched(row)) or row)(torch.zeros(2, 3))
        >>> seen, is_batched(torch.zeros(2))
        ([True], False)
    """
    return isinstance(value, Tensor) and bool(torch._C._functorch.is_batchedtensor(value))


def trials_first(tensor: Tensor, in_dim: int | None, trials: int) -> Tensor:
    """``tensor`` with its trial dimension first; a tensor shared by all trials is expanded (a view).

    Example::

        >>> trials_first(torch.zeros(5, 3, 2), 1, 3).shape, trials_first(torch.zeros(5), None, 3).shape
        (torch.Size([3, 5, 2]), torch.Size([3, 5]))
    """
    if in_dim is not None:
        return tensor.movedim(in_dim, 0)
    return tensor.unsqueeze(0).expand(trials, *tensor.shape)


def trials_first_or_shared(tensor: Tensor, in_dim: int | None) -> Tensor:
    """``tensor`` as ``[B, ...]`` with its trial dimension first, or ``[1, ...]`` when all trials share it.

    Example::

        >>> trials_first_or_shared(torch.zeros(3, 2), None).shape, trials_first_or_shared(torch.zeros(3, 2), 1).shape
        (torch.Size([1, 3, 2]), torch.Size([2, 3]))
    """
    return tensor.unsqueeze(0) if in_dim is None else tensor.movedim(in_dim, 0)


def trials_next_to_batch(tensor: Tensor, in_dim: int | None, trials: int) -> Tensor:
    """An ``[N, C, *]`` input as ``[N, B, C, *]``: the trial dimension after the batch (expanded when shared).

    Example::

        >>> trials_next_to_batch(torch.zeros(3, 8, 4), 0, 3).shape
        torch.Size([8, 3, 4])
        >>> trials_next_to_batch(torch.zeros(8, 4), None, 3).shape
        torch.Size([8, 3, 4])
    """
    if in_dim is not None:
        return tensor.movedim(in_dim, 1)
    return tensor.unsqueeze(1).expand(tensor.shape[0], trials, *tensor.shape[1:])


class VmapOnlyFunction(torch.autograd.Function):
    """Base of the trial rules: an autograd Function applied only to tensors that vmap maps over.

    Subclasses set the ``vmap`` staticmethod. torch calls it with the stacked tensors and their trial dims,
    and autograd records the ops it runs on them, so the rules need no backward of their own. ``forward``
    would run only if nothing were mapped at vmap's level (the rules are not applied then) or under another
    torch.func transform, which the rules do not support: it says so.
    """

    generate_vmap_rule = False

    @staticmethod
    def forward(*args: Any) -> Any:
        """Refuses: the rules run only as vmap rules."""
        raise RuntimeError(
            "a lightning_hydro trial rule ran outside torch.func.vmap (inside another torch.func transform?); "
            "call the torch.nn.functional op directly there."
        )

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        """Nothing to save: autograd records the ops of the vmap rule."""

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        """Never reached (see :meth:`forward`)."""
        raise RuntimeError("lightning_hydro's trial rules are differentiated through their vmap rule only")
