"""muP's per-tensor learning-rate and weight-decay multipliers, by optimizer rule.

Two rules, as in mup's ``MuAdam`` and ``MuSGD`` (Tensor Programs V, table 3), with ``m`` the width
multiplier of a tensor's fan-in (``1 / S`` for a surrogate at width / S, 1 at full size):

- ``"adam"`` (entrywise-normalised updates: Adam, AdamW, RMSprop, Adagrad, ...): matrix-like tensors (two
  width dimensions) train at ``lr / m`` with weight decay ``wd * m``; every other tensor is unchanged.
- ``"sgd"``: vector-like tensors (one width dimension: biases, input and readout weights) train at
  ``lr * m`` with ``wd / m``; matrix-like ones at ``lr / r`` with ``wd * r``, where ``r`` is the ratio of
  the fan-in to the fan-out multiplier (1 for square hidden layers).

Example::

    >>> from mup import InfDim, InfShape
    >>> hidden = InfShape([InfDim(256, 64), InfDim(256, 64)])   # a 64 x 64 surrogate of 256 x 256
    >>> multipliers(hidden, "adam")
    Multipliers(lr=4.0, weight_decay=0.25)
    >>> multipliers(InfShape([InfDim(256, 64)]), "sgd")         # a bias
    Multipliers(lr=0.25, weight_decay=4.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NamedTuple, get_args

import torch
from mup import InfShape

__all__ = ["DEFAULT_RULES", "Multipliers", "OptimizerRule", "multipliers", "optimizer_rule", "qualified_name"]

OptimizerRule = Literal["adam", "sgd"]

DEFAULT_RULES: dict[type[torch.optim.Optimizer], OptimizerRule] = {
    torch.optim.Adam: "adam",
    torch.optim.AdamW: "adam",
    torch.optim.Adamax: "adam",
    torch.optim.NAdam: "adam",
    torch.optim.RAdam: "adam",
    torch.optim.RMSprop: "adam",
    torch.optim.Adagrad: "adam",
    torch.optim.SGD: "sgd",
    torch.optim.ASGD: "sgd",
}
"""The rule of each torch optimizer muP has one for (subclasses inherit it)."""


class Multipliers(NamedTuple):
    """Factors applied to one tensor's learning rate and weight decay."""

    lr: float
    weight_decay: float


def multipliers(infshape: InfShape, rule: OptimizerRule) -> Multipliers:
    """The muP multipliers of a tensor with this ``InfShape`` under ``rule``.

    Raises:
        ValueError: an unknown rule, or a tensor with more than two width dimensions (muP defines none).
    """
    if rule not in get_args(OptimizerRule):
        raise ValueError(f"multipliers: rule must be one of {get_args(OptimizerRule)}, got {rule!r}.")
    width_dims = infshape.ninf()
    if width_dims > 2:
        raise ValueError(
            f"multipliers: a tensor with shape {infshape.shape()} has {width_dims} width dimensions; muP "
            "defines learning rates for at most two. Reshape it into a matrix, or keep the extra width "
            "hyperparameter out of width=[...]."
        )
    if rule == "adam":
        if width_dims == 2:
            m = float(infshape.width_mult())
            return Multipliers(lr=1.0 / m, weight_decay=m)
        return Multipliers(lr=1.0, weight_decay=1.0)
    if width_dims == 1:
        m = float(infshape.width_mult())
        return Multipliers(lr=m, weight_decay=1.0 / m)
    if width_dims == 2:
        r = float(infshape.fanin_fanout_mult_ratio())
        return Multipliers(lr=1.0 / r, weight_decay=r)
    return Multipliers(lr=1.0, weight_decay=1.0)


def qualified_name(cls: type) -> str:
    """``module.QualName`` of a class: how optimizer rules are keyed, so that they survive checkpoints."""
    return f"{cls.__module__}.{cls.__qualname__}"


def optimizer_rule(optimizer: torch.optim.Optimizer, extra_rules: Mapping[str, OptimizerRule]) -> OptimizerRule:
    """The rule for ``optimizer``: from ``extra_rules`` (keyed by ``qualified_name``), else ``DEFAULT_RULES``.

    Looked up along the class's MRO, so a subclass of ``Adam`` follows the Adam rule.

    Raises:
        TypeError: an optimizer class with no rule.
    """
    defaults = {qualified_name(cls): rule for cls, rule in DEFAULT_RULES.items()}
    for cls in type(optimizer).__mro__:
        name = qualified_name(cls)
        if name in extra_rules:
            return extra_rules[name]
        if name in defaults:
            return defaults[name]
    raise TypeError(
        f"Surrogate: no muP learning-rate rule for optimizer {type(optimizer).__name__}. Known: "
        f"{sorted(cls.__name__ for cls in DEFAULT_RULES)}. Tell the surrogate which rule it follows, e.g. "
        f"Surrogate(..., optimizer_rules={{{type(optimizer).__name__}: 'adam'}}) for entrywise-normalised "
        "updates (Adam-like) or 'sgd' for updates proportional to the gradient."
    )
