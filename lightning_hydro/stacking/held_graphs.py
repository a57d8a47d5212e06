"""Tensors with an autograd graph that a module's Python attributes hold, and letting go of them.

Lightning's docs keep each step's loss in a list until the epoch's end (``self.training_step_outputs.append(loss)``),
and its GAN tutorial keeps ``self.generated_imgs``: each such tensor holds its step's autograd graph, which in a
fused group is the whole group's (its activations, and the stacked parameters' gradient accumulators). A trial that
leaves the group mid-epoch would hold the group's graphs until the epoch end that clears its list: it lets go of
those graphs here, when it leaves.

torch's own modules hold such tensors too: after a ``functional_call`` (the loop backend runs each trial that way),
an ``nn.LSTM``/``nn.GRU``/``nn.RNN`` keeps the call's weights in ``_flat_weights``, rows unbound from the stacked
parameters, and once an optimizer step has changed those in place torch refuses even to read such a row's
``grad_fn``. Those count as holding a graph (they hold the unbind's), and are released as the others.

Example::

    >>> import torch
    >>> from torch import nn
    >>> module = nn.Linear(2, 1)
    >>> module.outputs = [module(torch.ones(2)).sum()]
    >>> [key for _, key, _ in held_graph_tensors(module)]
    [0]
    >>> release_held_graphs(module)
    >>> module.outputs[0].grad_fn is None
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import Tensor, nn

__all__ = ["held_graph_tensors", "release_held_graphs"]

_TORCH_OWN = frozenset({"_parameters", "_buffers", "_modules"})  # leaves and submodules (walked as modules)


def held_graph_tensors(module: nn.Module) -> Iterator[tuple[Any, Any, Tensor]]:
    """Each tensor with an autograd graph in the module's (and its submodules') attributes, also in lists and dicts.

    Yields ``(container, key, tensor)`` with ``container[key] is tensor``: the attributes' dict, a list or a dict;
    ``container`` is None for a tensor in a tuple (which cannot be changed in place).
    """
    seen: set[int] = set()
    for owner in module.modules():
        attributes = vars(owner)
        for name, value in attributes.items():
            if name not in _TORCH_OWN:
                yield from _walk(attributes, name, value, seen)


def release_held_graphs(module: nn.Module) -> None:
    """Replace each tensor :func:`held_graph_tensors` finds with its detached value, in place (tuples' stay)."""
    for container, key, tensor in list(held_graph_tensors(module)):
        if container is not None:
            container[key] = tensor.detach()


def _walk(container: Any, key: Any, value: Any, seen: set[int]) -> Iterator[tuple[Any, Any, Tensor]]:
    if isinstance(value, Tensor):
        if _holds_graph(value):
            yield container, key, value
        return
    if not isinstance(value, (list, tuple, dict)) or id(value) in seen:
        return
    seen.add(id(value))
    inner = None if isinstance(value, tuple) else value
    for k, v in value.items() if isinstance(value, dict) else enumerate(value):
        yield from _walk(inner, k, v, seen)


def _holds_graph(tensor: Tensor) -> bool:
    try:
        return tensor.grad_fn is not None
    except RuntimeError:  # an output of unbind/split whose base changed in place since: it still holds that graph
        return True
