"""Which fused update, if any, can step a group's trial optimizers in one pass (else the universal path)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from torch.optim import SGD, Adam, AdamW, Optimizer

from lightning_hydro.backends.compiled_step import CompileSetting
from lightning_hydro.fused.step.compiled_update import CompiledUpdate
from lightning_hydro.fused.step.fused_update import FusedAdamUpdate, FusedSGDUpdate, FusedUpdate

__all__ = ["select_fused_update"]


def _group_structure(opt: Optimizer, params: Sequence[nn.Parameter]) -> list[int | None] | str:
    """The group index of each parameter (None: in no group), or why the optimizer cannot be fused."""
    index = {id(p): i for i, p in enumerate(params)}
    group_of: list[int | None] = [None] * len(params)
    for g, group in enumerate(opt.param_groups):
        for p in group["params"]:
            if id(p) not in index:
                return "an optimizer holds parameters outside the trial"
            group_of[index[id(p)]] = g
        if group.get("maximize") or group.get("differentiable"):
            return "maximize=True or differentiable=True"
    return group_of


def select_fused_update(
    optimizers: Sequence[Optimizer],
    trial_params: Sequence[Sequence[nn.Parameter]],
    stacked: Sequence[nn.Parameter],
    *,
    compile: CompileSetting | CompiledUpdate = False,
) -> FusedUpdate | str:
    """A fused update for these trial optimizers, or the reason why they need the universal path.

    The trials' optimizers must be of one class (SGD, Adam or AdamW) and group the parameters the same
    way (e.g. the per-multiplier groups of muP surrogates); hyperparameters may differ per trial and group.

    Args:
        optimizers: each trial's optimizer, in row order.
        trial_params: each trial's parameters in the order of the stacked parameters.
        stacked: the stacked parameters.
        compile: run the update's device work under ``torch.compile`` (see :mod:`.compiled_update`): True,
            ``"reduce-overhead"``, or the group's :class:`~.compiled_update.CompiledUpdate`.
    """
    kinds = {type(opt) for opt in optimizers}
    if len(kinds) != 1:
        return f"the trials use different optimizer classes ({', '.join(sorted(k.__name__ for k in kinds))})"
    kind = kinds.pop()
    if kind not in (SGD, Adam, AdamW):
        return f"{kind.__name__} has no fused implementation (SGD, Adam and AdamW do)"
    structures = []
    for opt, params in zip(optimizers, trial_params):
        if any(p.is_complex() for p in params):
            return "complex parameters"
        structure = _group_structure(opt, params)
        if isinstance(structure, str):
            return structure
        structures.append(structure)
    if any(s != structures[0] for s in structures[1:]):
        return "the trials' optimizers group their parameters differently"
    update: FusedUpdate
    if kind is SGD:
        update = FusedSGDUpdate(stacked, structures[0])
        update.compile(compile)
        return update
    groups = [g for opt in optimizers for g in opt.param_groups]
    amsgrad = {bool(g["amsgrad"]) for g in groups}
    decoupled = {bool(g.get("decoupled_weight_decay", kind is AdamW)) for g in groups}
    if len(amsgrad) != 1 or len(decoupled) != 1:
        return "the trials differ in amsgrad or decoupled weight decay"
    update = FusedAdamUpdate(stacked, structures[0], amsgrad=amsgrad.pop(), decoupled=decoupled.pop())
    update.compile(compile)
    return update
