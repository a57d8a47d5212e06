"""Width padding: trials whose tensors differ only in size, stacked at the group's largest shape.

A trial built at its own width (its own constructor, its own initialisation) is stacked by zero-padding
each of its parameters and buffers at the END of every dimension up to the group's elementwise largest
shape. The trial's own tensor is then the leading corner of its row (:func:`true_region`), which stays a
view: the trial module remains bound to the stacked storage at its own width, its optimizer sees only its
own elements, and ``unfuse`` copies a module of its own width.

Why zeros keep a padded unit inert: a hidden unit whose incoming weights and bias are zero has pre-activation
zero; whose outgoing weights are zero contributes nothing downstream, whatever its activation is; and the
gradient reaching it through zero outgoing weights is zero. The trial's own optimizer never touches the padded
elements (it holds the views), so they stay exactly zero. Pure torch.

Example::

    >>> import torch
    >>> padded_shape([(4, 3), (6, 2)])
    (6, 3)
    >>> pad_to(torch.ones(2, 2), (3, 4)).sum().item()
    4.0
    >>> true_region((2, 2))
    (slice(0, 2, None), slice(0, 2, None))
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = ["pad_to", "padded_shape", "padding_mask", "true_region", "zero_padding_"]

Shape = tuple[int, ...]


def padded_shape(shapes: Sequence[Sequence[int]]) -> Shape:
    """The elementwise largest of shapes of one rank.

    Raises:
        ValueError: if the shapes differ in rank (a padded trial keeps its tensor's number of dimensions).
    """
    ranks = {len(shape) for shape in shapes}
    if len(ranks) != 1:
        raise ValueError(f"padded_shape: shapes of different ranks cannot be padded to one: {list(shapes)}.")
    return tuple(max(sizes) for sizes in zip(*shapes)) if shapes and ranks != {0} else ()


def true_region(shape: Sequence[int]) -> tuple[slice, ...]:
    """The index of a tensor of ``shape`` inside its zero-padded version: the leading corner."""
    return tuple(slice(0, size) for size in shape)


def pad_to(tensor: Tensor, shape: Sequence[int]) -> Tensor:
    """``tensor`` zero-padded at the end of each dimension to ``shape`` (a copy; the tensor itself if equal).

    Raises:
        ValueError: if ``tensor`` is larger than ``shape`` in some dimension, or of another rank.
    """
    if tuple(tensor.shape) == tuple(shape):
        return tensor
    if tensor.dim() != len(shape) or any(have > want for have, want in zip(tensor.shape, shape)):
        raise ValueError(f"pad_to: cannot pad a tensor of shape {list(tensor.shape)} to {list(shape)}.")
    amounts: list[int] = []
    for have, want in zip(reversed(tensor.shape), reversed(shape)):
        amounts += [0, want - have]
    return F.pad(tensor, amounts)


def padding_mask(true_shapes: Sequence[Sequence[int]], shape: Sequence[int], *, like: Tensor) -> Tensor:
    """A ``[B, *shape]`` 0/1 tensor (``like``'s dtype and device): 1 on each row's true region, 0 on its padding."""
    mask = torch.zeros((len(true_shapes), *shape), dtype=like.dtype, device=like.device)
    for row, true in enumerate(true_shapes):
        mask[row][true_region(true)] = 1
    return mask


def zero_padding_(stacked: Tensor, true_shapes: Sequence[Sequence[int]]) -> Tensor:
    """Set every row's padded elements of a ``[B, ...]`` tensor to zero, in place; returns it.

    The general guard for arithmetic that would not keep padding zero (e.g. a fused optimizer update over the
    whole stacked tensor fed a gradient that is not zero on the padding).
    """
    if all(tuple(true) == tuple(stacked.shape[1:]) for true in true_shapes):
        return stacked
    with torch.no_grad():
        stacked.mul_(padding_mask(true_shapes, stacked.shape[1:], like=stacked))
    return stacked
