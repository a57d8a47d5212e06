"""``WidthScaling``: how one module is scaled under muP, attached to it, and kept in its checkpoints.

The record holds everything muP needs about a module (ratio, full-size widths, base shapes, readouts,
optimizer rules) as plain data. ``attach`` applies it to a freshly built module:

- sets mup's ``infshape`` on every parameter (lost on ``deepcopy``; nothing here relies on it);
- gives every readout a ``ReadoutScale`` pre-hook with its cached ``1 / width_mult`` and, when
  initialising, zero (or ``MuReadout``-rescaled) weights; rescales hidden biases as mup does;
- wraps the module's ``configure_optimizers`` so that the optimizers it returns carry muP's per-tensor
  multipliers, whatever Lightning format it returns, with its LR schedulers split to match;
- wraps ``on_save_checkpoint`` so that checkpoints hold the record under ``"width_scaling"``.

The wrappers are ``functools.partial`` objects over module-level functions stored on the instance: they
survive ``copy.deepcopy`` (which rebinds them to the copy) and pickling, and Lightning calls them as the
module's hooks.

Example::

    >>> import copy, torch
    >>> from lightning_hydro.scaling import Surrogate
    >>> from lightning_hydro.demos.digits import DigitsMLP
    >>> model = Surrogate(DigitsMLP, width=["hidden_dim"], ratio=4).build(hidden_dim=128, optimizer="adam")
    >>> model.width_scaling.width_mult
    0.25
    >>> twin = copy.deepcopy(model)
    >>> sorted({g["mup_lr_mult"] for g in twin.configure_optimizers().param_groups})
    [1.0, 4.0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, ClassVar, TypeVar

import torch
from mup import InfShape, apply_infshapes
from torch import nn

from lightning_hydro.scaling.base_shapes import BaseShape, infshapes
from lightning_hydro.scaling.multipliers import Multipliers, OptimizerRule, multipliers, optimizer_rule
from lightning_hydro.scaling.param_groups import (
    find_optimizers,
    is_split,
    split_param_groups,
    split_scheduler,
)
from lightning_hydro.scaling.readout import (
    OUT_IN_LAYERS,
    ReadoutScale,
    initialize_readout,
    readout_multiplier,
    shapes_by_id,
)

__all__ = ["WidthScaling", "configure_scaled_optimizers", "fold_multipliers", "width_scaling_of"]

ModuleT = TypeVar("ModuleT", bound=nn.Module)


@dataclass(frozen=True)
class WidthScaling:
    """How a module is scaled: built at width / ``ratio`` against the full-size base.

    Args:
        ratio: width divisor S of the module (1: the full-size base itself).
        widths: full-size value of each width hyperparameter.
        base_shapes: per parameter, the size of each width dimension at full size (``None``: fixed size).
        readouts: names of the readout modules.
        zero_readout: whether readouts start at zero (else at ``MuReadout``'s rescaled init).
        optimizer_rules: muP rule of optimizer classes beyond the defaults, keyed by ``qualified_name``.
    """

    ratio: int
    widths: Mapping[str, int]
    base_shapes: Mapping[str, BaseShape]
    readouts: tuple[str, ...]
    zero_readout: bool = True
    optimizer_rules: Mapping[str, OptimizerRule] = field(default_factory=dict)

    ATTRIBUTE: ClassVar[str] = "width_scaling"
    CHECKPOINT_KEY: ClassVar[str] = "width_scaling"

    @property
    def width_mult(self) -> float:
        """The width multiplier of the module in muP: ``1 / ratio``."""
        return 1.0 / self.ratio

    def infshapes(self, module: nn.Module) -> dict[str, InfShape]:
        """The mup ``InfShape`` of each of ``module``'s parameters, by name."""
        return infshapes(self.base_shapes, module)

    def multipliers(self, module: nn.Module, rule: OptimizerRule) -> dict[str, Multipliers]:
        """The muP learning-rate and weight-decay multipliers of each parameter under ``rule``, by name."""
        return {name: multipliers(shape, rule) for name, shape in self.infshapes(module).items()}

    def attach(self, module: ModuleT, *, initialize: bool = True) -> ModuleT:
        """Apply this scaling to ``module`` (built at width / ``ratio``); returns ``module``.

        Args:
            module: a freshly built module, or one about to load a checkpoint's weights.
            initialize: rescale the initial weights (readouts, hidden biases). Pass ``False`` when the
                weights will be overwritten anyway, e.g. before ``load_state_dict``.

        Raises:
            ValueError: ``module`` already carries a width scaling.
        """
        existing = width_scaling_of(module)
        if existing is not None:
            raise ValueError(
                f"WidthScaling.attach: {type(module).__name__} is already scaled (ratio {existing.ratio}); "
                "build a fresh module instead of attaching twice."
            )
        shapes = self.infshapes(module)
        apply_infshapes(module, shapes)
        by_id = shapes_by_id(module, shapes)
        modules = dict(module.named_modules())
        shared = _shared_parameters(module)
        for name in self.readouts:
            readout = modules[name]
            if initialize:
                initialize_readout(readout, by_id, zero=self.zero_readout, shared=shared)
            multiplier = readout_multiplier(readout, by_id)
            if multiplier != 1.0:
                readout.register_forward_pre_hook(ReadoutScale(multiplier))
        if initialize:
            readout_params = {id(p) for name in self.readouts for p in modules[name].parameters()}
            _rescale_hidden_biases(module, by_id, skip=readout_params)
        setattr(module, self.ATTRIBUTE, self)
        if callable(getattr(type(module), "configure_optimizers", None)):
            module.__dict__["configure_optimizers"] = partial(configure_scaled_optimizers, module)
        if callable(getattr(type(module), "on_save_checkpoint", None)):
            module.__dict__["on_save_checkpoint"] = partial(_save_width_scaling, module)
        return module

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, dicts, numbers): what checkpoints store."""
        record = asdict(self)
        record["base_shapes"] = {name: list(shape) for name, shape in self.base_shapes.items()}
        record["readouts"] = list(self.readouts)
        record["widths"] = dict(self.widths)
        record["optimizer_rules"] = dict(self.optimizer_rules)
        return record

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> WidthScaling:
        """Rebuild the record saved by ``to_dict``.

        Raises:
            ValueError: ``record`` lacks a field.
        """
        missing = {"ratio", "widths", "base_shapes", "readouts"} - set(record)
        if missing:
            raise ValueError(
                f"WidthScaling.from_dict: not a width-scaling record, missing {sorted(missing)}; pass "
                f"checkpoint[{cls.CHECKPOINT_KEY!r}] of a checkpoint saved from a surrogate."
            )
        return cls(
            ratio=int(record["ratio"]),
            widths=dict(record["widths"]),
            base_shapes={name: tuple(shape) for name, shape in record["base_shapes"].items()},
            readouts=tuple(record["readouts"]),
            zero_readout=bool(record.get("zero_readout", True)),
            optimizer_rules=dict(record.get("optimizer_rules", {})),
        )


def width_scaling_of(module: nn.Module) -> WidthScaling | None:
    """The ``WidthScaling`` attached to ``module``, or ``None`` for an unscaled module."""
    scaling = module.__dict__.get(WidthScaling.ATTRIBUTE)
    return scaling if isinstance(scaling, WidthScaling) else None


def fold_multipliers(module: nn.Module, config: Any) -> Any:
    """Fold muP's multipliers for ``module``'s parameters into the optimizers of ``config``, in place.

    ``config`` is anything ``configure_optimizers()`` may return (an optimizer, lists, dicts, Lightning
    scheduler configs); it is returned unchanged but for the optimizers' param groups and the schedulers'
    per-group values. Optimizers already folded are left alone. For plain PyTorch loops::

        optimizer = fold_multipliers(model, torch.optim.AdamW(model.parameters(), lr=1e-3))

    Raises:
        ValueError: ``module`` is not scaled, or an optimizer holds a tensor that is not its parameter.
        TypeError: an optimizer class without a muP rule.
    """
    scaling = width_scaling_of(module)
    if scaling is None:
        raise ValueError(
            f"fold_multipliers: {type(module).__name__} has no width scaling; build it with Surrogate.build()."
        )
    shapes = shapes_by_id(module, scaling.infshapes(module))
    optimizers, schedulers = find_optimizers(config)
    splits = {}
    for optimizer in optimizers:
        if is_split(optimizer):
            continue
        rule = optimizer_rule(optimizer, scaling.optimizer_rules)

        def multipliers_of(param: torch.nn.Parameter, rule: OptimizerRule = rule) -> Multipliers:
            if id(param) not in shapes:
                raise ValueError(
                    f"fold_multipliers: the optimizer holds a tensor of shape {tuple(param.shape)} that is "
                    f"not a parameter of {type(module).__name__}; muP has no width information for it. "
                    "Optimize only the module's own parameters."
                )
            return multipliers(shapes[id(param)], rule)

        splits[id(optimizer)] = split_param_groups(optimizer, multipliers_of)
    for scheduler in schedulers:
        if id(scheduler.optimizer) in splits:
            split_scheduler(scheduler, splits[id(scheduler.optimizer)])
    return config


def configure_scaled_optimizers(module: nn.Module) -> Any:
    """``module``'s own ``configure_optimizers()``, muP's multipliers folded in (see ``fold_multipliers``)."""
    return fold_multipliers(module, type(module).configure_optimizers(module))  # type: ignore[attr-defined]


def _save_width_scaling(module: nn.Module, checkpoint: dict[str, Any]) -> None:
    type(module).on_save_checkpoint(module, checkpoint)  # type: ignore[attr-defined]
    scaling = width_scaling_of(module)
    if scaling is not None:
        checkpoint[WidthScaling.CHECKPOINT_KEY] = scaling.to_dict()


def _shared_parameters(module: nn.Module) -> set[int]:
    """Ids of parameters registered under more than one name (tied weights)."""
    seen: dict[int, int] = {}
    for _, param in module.named_parameters(remove_duplicate=False):
        seen[id(param)] = seen.get(id(param), 0) + 1
    return {key for key, count in seen.items() if count > 1}


def _rescale_hidden_biases(module: nn.Module, shapes: Mapping[int, InfShape], skip: set[int]) -> None:
    """Keep biases of layers with a width fan-in at their full-size scale, as mup's ``rescale_linear_bias``.

    PyTorch draws a bias from U(+-1/sqrt(fan_in)); muP wants its size independent of width.
    """
    with torch.no_grad():
        for layer in module.modules():
            bias = getattr(layer, "bias", None)
            if isinstance(layer, OUT_IN_LAYERS) and isinstance(bias, nn.Parameter) and id(bias) not in skip:
                fan_in_mult = float(shapes[id(layer.weight)][1].width_mult())
                if fan_in_mult != 1.0:
                    bias.mul_(math.sqrt(fan_in_mult))
