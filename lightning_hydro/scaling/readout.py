"""The readout: the layers that map a width dimension to a fixed size, and muP's treatment of them.

muP multiplies a readout's input by ``1 / width_mult`` (mup's ``MuReadout``) and starts its weights at
zero. mup reads ``width_mult`` from ``weight.infshape`` inside ``forward``; under ``torch.func.vmap`` the
weights are batched tensors without that attribute, so here the multiplier is computed once and cached as
a plain float in a forward pre-hook (``ReadoutScale``) that works with any module and any fusion backend.

Readouts are found from shapes: an ``nn.Linear`` or convolution whose input dimension scales with width
and whose output dimension does not. A parameter of any other module that has both a width and a fixed
dimension could be an input table or a hand-written readout; a model with such a parameter must name its
readout(s) explicitly.

Example::

    >>> import torch
    >>> head = torch.nn.Linear(4, 2)
    >>> _ = head.register_forward_pre_hook(ReadoutScale(8.0))
    >>> x = torch.ones(1, 4)
    >>> bool(torch.allclose(head(x), torch.nn.functional.linear(8.0 * x, head.weight, head.bias)))
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from mup import InfShape, MuReadout
from torch import nn

__all__ = ["ReadoutScale", "find_readouts", "initialize_readout", "readout_multiplier", "shapes_by_id"]

ShapesById = Mapping[int, InfShape]
"""``InfShape`` of each parameter by ``id``, so that a shared (tied) parameter is found from every module."""

# Layers whose parameter layout is known, so that their role follows from which dims scale.
OUT_IN_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)  # weight [out, in, ...]
_INPUT_TABLES = (nn.Embedding, nn.EmbeddingBag)  # weight [num, dim]: an input layer whatever scales
_VECTOR_ONLY = (
    nn.LayerNorm,
    nn.GroupNorm,
    nn.RMSNorm,
    nn.modules.batchnorm._NormBase,
    nn.PReLU,
)


class ReadoutScale:
    """Forward pre-hook multiplying a readout's input by a cached float (``output_mult / width_mult``).

    A plain float, not a tensor attribute, so it survives ``vmap``, ``functional_call``, ``deepcopy`` and
    pickling, and is the same in every trial of a fused group of one width.
    """

    def __init__(self, multiplier: float) -> None:
        self.multiplier = float(multiplier)

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """Scale the first positional input of ``module``'s forward."""
        return (args[0] * self.multiplier, *args[1:])

    def __repr__(self) -> str:
        return f"ReadoutScale({self.multiplier})"


def find_readouts(
    model: nn.Module, infshapes: Mapping[str, InfShape], readout: Sequence[str] | None = None
) -> tuple[str, ...]:
    """Names of the readout modules of ``model``: found from its parameters' ``infshapes``, or checked.

    Raises:
        TypeError: the model uses mup's ``MuReadout``.
        ValueError: an ambiguous model (a parameter whose role its shape does not tell), a model without
            readout, or a given name that is not a readout.
    """
    modules = dict(model.named_modules())
    for name, module in modules.items():
        if isinstance(module, MuReadout):
            raise TypeError(
                f"Surrogate: {name!r} is a mup.MuReadout, whose forward reads weight.infshape, which fused "
                "(vmap) training drops. Use a plain nn.Linear: the surrogate applies the readout scaling."
            )
    by_id = shapes_by_id(model, infshapes)
    found, unclear = _classify(model, by_id)
    if readout is None:
        if unclear:
            name, shape = unclear[0]
            raise ValueError(
                f"Surrogate: cannot tell from its shape whether parameter {name!r} (base shape {shape}, "
                "None = fixed size) is an input weight or the readout: it has a width and a fixed "
                "dimension and belongs to a module whose layout is unknown. Name the readout module(s) "
                f"explicitly, e.g. Surrogate(..., readout=[{(found[0] if found else 'head')!r}]); every "
                "module not named is then an input or hidden layer."
            )
        if not found:
            raise ValueError(
                "Surrogate: cannot find the readout: no nn.Linear or convolution maps a width dimension to "
                "a fixed size. muP needs the output layer to read the width, e.g. nn.Linear(hidden_dim, "
                "num_classes); if yours is another module, name it with Surrogate(..., readout=['name'])."
            )
        return tuple(found)
    for name in readout:
        if name not in modules or name == "":
            owners = [n for n, m in modules.items() if n and any(True for _ in m.parameters(recurse=False))]
            raise ValueError(
                f"Surrogate: readout {name!r} is not a submodule of the model. Submodules with parameters: "
                f"{owners[:10]}."
            )
        shapes = [by_id[id(p)] for p in modules[name].parameters()]
        if not any(shape.ninf() for shape in shapes) or (
            isinstance(modules[name], OUT_IN_LAYERS) and name not in found
        ):
            raise ValueError(
                f"Surrogate: {name!r} is not a readout: a readout maps a width dimension to a fixed size, "
                f"but its parameters have base shapes {[s.base_shape() for s in shapes]} (None = fixed size)."
            )
    missing = [name for name in found if not any(_within(name, r) for r in readout)]
    if missing:
        raise ValueError(
            f"Surrogate: {missing[0]!r} also maps a width dimension to a fixed size, so muP must treat it "
            f"as a readout too. Add it: readout={[*readout, *missing]}."
        )
    return tuple(readout)


def shapes_by_id(model: nn.Module, infshapes: Mapping[str, InfShape]) -> dict[int, InfShape]:
    """Key ``infshapes`` (by parameter name) by parameter ``id`` instead."""
    return {id(param): infshapes[name] for name, param in model.named_parameters()}


def readout_multiplier(readout: nn.Module, shapes: ShapesById) -> float:
    """``1 / width_mult`` of a readout: one over the width multiplier of its weight's input dimension."""
    for param in readout.parameters():
        if shapes[id(param)].ninf():
            return 1.0 / float(shapes[id(param)].width_mult())
    return 1.0


def initialize_readout(readout: nn.Module, shapes: ShapesById, *, zero: bool, shared: set[int]) -> None:
    """Start a readout at zero (muP's recommended init), or rescale PyTorch's init as ``MuReadout`` does.

    Touches the weights and biases of the readout's layers, not norms or input tables inside it. Parameters
    in ``shared`` (ids of parameters that other modules also use, e.g. a tied embedding) are left alone:
    zeroing them would zero the other module too.
    """
    multiplier = readout_multiplier(readout, shapes)
    with torch.no_grad():
        for module in readout.modules():
            if isinstance(module, (*_INPUT_TABLES, *_VECTOR_ONLY)):
                continue
            for param in module.parameters(recurse=False):
                if id(param) in shared:
                    continue
                if zero:
                    param.zero_()
                else:
                    param.mul_(math.sqrt(1.0 / multiplier))


def _classify(model: nn.Module, shapes: ShapesById) -> tuple[list[str], list[tuple[str, Any]]]:
    """(readout-like known layers, parameters of unknown layout with a width and a fixed dimension)."""
    found: list[str] = []
    unclear: list[tuple[str, Any]] = []
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        if isinstance(module, OUT_IN_LAYERS):
            shape = shapes.get(id(module.weight))  # None: a parametrized weight, checked via its tensors
            if shape is not None and shape[1].isinf() and not shape[0].isinf():
                found.append(module_name)
        elif not isinstance(module, (*_INPUT_TABLES, *_VECTOR_ONLY)):
            for param_name, param in module.named_parameters(recurse=False):
                shape = shapes[id(param)]
                if len(shape) >= 2 and 0 < shape.ninf() < len(shape):
                    unclear.append((prefix + param_name, shape.base_shape()))
    return found, unclear


def _within(name: str, parent: str) -> bool:
    return name == parent or name.startswith(parent + ".")
