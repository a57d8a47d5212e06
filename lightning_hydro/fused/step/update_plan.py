"""The plan of a fused update: its parameters grouped into parts, each updated by one sequence of foreach calls.

A part holds the parameters whose param groups are updated the same way in every row (e.g. SGD with momentum in
every row, or without in any; with weight decay or without), with their factors' views and state tensors. The
plan is made again only when the set of parameters with gradients changes or a hyperparameter does (a scheduler
may turn momentum or weight decay on): :meth:`~lightning_hydro.fused.step.fused_update.FusedUpdate.step` asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import Tensor

if TYPE_CHECKING:
    from lightning_hydro.fused.step.fused_update import FusedUpdate
    from lightning_hydro.fused.step.row_hyperparameters import RowHyperparameters

__all__ = ["Part", "plan_parts"]


@dataclass
class Part:
    """Parameters updated by the same sequence of foreach calls (one kind of group, with or without decay)."""

    indices: list[int]
    kind: str
    decay: bool
    params: list[Tensor] = field(default_factory=list)
    views: dict[str, list[Tensor]] = field(default_factory=dict)
    states: dict[str, list[Tensor]] = field(default_factory=dict)


def plan_parts(update: FusedUpdate, active: list[int], factors: RowHyperparameters) -> list[Part]:
    """The parts of ``update``'s step over the parameters ``active``, from the factors as last copied."""
    kinds, decays = {}, {}
    for g in {update.group_of[i] for i in active}:
        assert g is not None
        values = factors.host_factors(g)
        kinds[g] = update.kind(values, g)
        decays[g] = update.decays(values)
    parts: dict[tuple[str, bool], Part] = {}
    for i in active:
        g = update.group_of[i]
        assert g is not None
        parts.setdefault((kinds[g], decays[g]), Part([], kinds[g], decays[g])).indices.append(i)
    for part in parts.values():
        part.params = [update.params[i] for i in part.indices]
        part.views = {name: [factors.views(name)[i] for i in part.indices] for name in update.NEUTRAL}
        for key in update.state_keys(part.kind):
            part.states[key] = [update.state_of(i, key) for i in part.indices]
    return list(parts.values())
