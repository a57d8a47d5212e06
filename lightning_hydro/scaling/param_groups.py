"""Fold per-tensor multipliers into an optimizer that already exists, and into its LR schedulers.

muP gives tensors of one param group different learning rates, so each group is split into one group per
multiplier, in place: the optimizer object the user returned (and every scheduler built on it) stays the
one Lightning or the fused core steps. Schedulers captured one value per group when they were built
(``base_lrs``, ``initial_lr``, ReduceLROnPlateau's ``min_lrs``, ...); those lists are split the same way,
lr-valued ones scaled by the group's multiplier. Each new group records its multipliers under
``"mup_lr_mult"`` and ``"mup_wd_mult"``, so the optimizer's ``state_dict`` (and a checkpoint) holds them.

Example::

    >>> import torch
    >>> a, b = torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2))
    >>> opt = torch.optim.SGD([a, b], lr=0.1)
    >>> sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    >>> split = split_param_groups(opt, lambda p: Multipliers(4.0 if p.dim() == 2 else 1.0, 1.0))
    >>> split_scheduler(sched, split)
    >>> [round(g["lr"], 3) for g in opt.param_groups], sched.base_lrs
    ([0.4, 0.1], [0.4, 0.1])
    >>> opt.step(); sched.step(); [round(g["lr"], 3) for g in opt.param_groups]
    [0.2, 0.05]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from lightning_hydro.scaling.multipliers import Multipliers

__all__ = [
    "LR_MULT_KEY",
    "WD_MULT_KEY",
    "GroupSplit",
    "find_optimizers",
    "split_param_groups",
    "split_scheduler",
]

LR_MULT_KEY = "mup_lr_mult"
WD_MULT_KEY = "mup_wd_mult"

# Param-group entries that hold a learning rate (schedulers write the last three).
_GROUP_LR_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")
# Scheduler attributes with one learning rate per param group, and with one other value per group.
_SCHEDULER_LR_LISTS = ("base_lrs", "_last_lr", "min_lrs", "max_lrs")
_SCHEDULER_GROUP_LISTS = ("lr_lambdas", "base_momentums", "max_momentums")

Scheduler = LRScheduler | ReduceLROnPlateau


@dataclass(frozen=True)
class GroupSplit:
    """How an optimizer's param groups were split: new group ``j`` came from old group ``origin[j]``."""

    num_old_groups: int
    origin: tuple[int, ...]
    lr_mults: tuple[float, ...]


def is_split(optimizer: torch.optim.Optimizer) -> bool:
    """Whether multipliers were already folded into ``optimizer`` (folding again would repeat them)."""
    return all(LR_MULT_KEY in group for group in optimizer.param_groups)


def split_param_groups(
    optimizer: torch.optim.Optimizer, multipliers_of: Callable[[torch.nn.Parameter], Multipliers]
) -> GroupSplit:
    """Split each param group of ``optimizer`` by the multipliers of its parameters, in place.

    A new group copies every setting of its old group; its learning rates are multiplied by the
    multipliers' ``lr`` and its ``weight_decay`` by their ``weight_decay``.
    """
    groups: list[dict[str, Any]] = []
    origin: list[int] = []
    lr_mults: list[float] = []
    for index, group in enumerate(optimizer.param_groups):
        buckets: dict[Multipliers, list[torch.nn.Parameter]] = {}
        for param in group["params"]:
            buckets.setdefault(multipliers_of(param), []).append(param)
        for mults, params in buckets.items():
            new = {key: value for key, value in group.items() if key != "params"}
            for key in _GROUP_LR_KEYS:
                if key in new:
                    new[key] = _scale(new[key], mults.lr)
            if "weight_decay" in new:
                new["weight_decay"] = _scale(new["weight_decay"], mults.weight_decay)
            new[LR_MULT_KEY], new[WD_MULT_KEY] = mults.lr, mults.weight_decay
            groups.append({"params": params, **new})
            origin.append(index)
            lr_mults.append(mults.lr)
    split = GroupSplit(len(optimizer.param_groups), tuple(origin), tuple(lr_mults))
    optimizer.param_groups[:] = groups
    return split


def split_scheduler(scheduler: Scheduler, split: GroupSplit) -> None:
    """Split the per-group values ``scheduler`` captured when it was built, as ``split`` split the groups.

    Raises:
        ValueError: a scheduler with one absolute floor for all groups (``eta_min``), which cannot follow
            groups whose learning rates now differ.
    """
    eta_min = getattr(scheduler, "eta_min", 0.0)
    if eta_min and any(mult != 1.0 for mult in split.lr_mults):
        raise ValueError(
            f"Surrogate: {type(scheduler).__name__}(eta_min={eta_min}) holds one absolute learning-rate "
            "floor for all param groups, but muP gives the groups different learning rates. Use "
            "eta_min=0, or a relative floor (LambdaLR with a factor that never drops below eta_min / lr)."
        )
    for name in _SCHEDULER_LR_LISTS:
        values = getattr(scheduler, name, None)
        if isinstance(values, list) and len(values) == split.num_old_groups:
            setattr(scheduler, name, [_scale(values[o], m) for o, m in zip(split.origin, split.lr_mults)])
    for name in _SCHEDULER_GROUP_LISTS:
        values = getattr(scheduler, name, None)
        if isinstance(values, list) and len(values) == split.num_old_groups:
            setattr(scheduler, name, [values[o] for o in split.origin])


def find_optimizers(config: Any) -> tuple[list[torch.optim.Optimizer], list[Scheduler]]:
    """Every optimizer and LR scheduler in a ``configure_optimizers()`` result, in any Lightning format.

    Chained and sequential schedulers are followed into the schedulers they hold. Each object is listed once.
    """
    optimizers: dict[int, torch.optim.Optimizer] = {}
    schedulers: dict[int, Scheduler] = {}
    for item in _walk(config):
        if isinstance(item, torch.optim.Optimizer):
            optimizers.setdefault(id(item), item)
        elif isinstance(item, LRScheduler | ReduceLROnPlateau):
            schedulers.setdefault(id(item), item)
    return list(optimizers.values()), list(schedulers.values())


def _walk(config: Any) -> Iterator[Any]:
    if isinstance(config, dict):
        for value in config.values():
            yield from _walk(value)
    elif isinstance(config, list | tuple):
        for value in config:
            yield from _walk(value)
    else:
        yield config
        for child in getattr(config, "_schedulers", ()) if isinstance(config, LRScheduler) else ():
            yield from _walk(child)


def _scale(value: Any, factor: float) -> Any:
    if factor == 1.0:
        return value
    return value * factor
