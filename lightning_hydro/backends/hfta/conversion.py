"""Converting trial modules into one model of fused operators, and keeping it in step with the trials.

The converted model is a copy of the template in which every supported module is its fused
counterpart, with the same parameter and buffer names: run it as
``torch.func.vmap(lambda p, b: functional_call(model, (p, b), args), in_dims=(0, 0))`` over the
trials' stacked state. The user's code between modules (``flatten``, ``view(x.size(0), -1)``,
``cat(dim=1)``, the loss) is not rewritten: it runs under vmap, which gives each trial its own logical
tensors, so it is correct by construction; only the operators change.

What stays with vmap's own rules is reported, and what neither can run correctly is refused with the
module path, its type, and what to do instead.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from torch import nn
from torch.nn.utils.parametrize import is_parametrized

from lightning_hydro.backends.deferred_metrics import metric_paths
from lightning_hydro.backends.hfta.errors import ConversionError
from lightning_hydro.backends.hfta.fused_operator import FusedModule, TrialAnchor
from lightning_hydro.backends.hfta.per_trial import differing_attributes
from lightning_hydro.backends.hfta.registry import (
    FUSED_CONTAINERS,
    FUSED_OPERATORS,
    ONLY_WHEN_TRIALS_DIFFER,
    has_tensors,
    is_groupable,
)
from lightning_hydro.backends.hfta.trial_grouped_module import TrialGroupedModule

Outcome = Literal["fused", "grouped", "native", "rejected"]


@dataclass(frozen=True)
class ModuleDecision:
    """What conversion does with one module.

    Attributes:
        path: dotted module path in the template (``""`` for the root).
        type_name: the module's class name.
        outcome: ``"fused"`` (fused operator), ``"grouped"`` (run per group of equal trial settings),
            ``"native"`` (left to vmap's own rules) or ``"rejected"``.
        reason: why, in words.
    """

    path: str
    type_name: str
    outcome: Outcome
    reason: str

    def __str__(self) -> str:
        return f"module '{self.path}' ({self.type_name}): {self.reason}"


@dataclass(frozen=True)
class ConversionPlan:
    """Every module's fate, decided before anything is changed.

    Attributes:
        decisions: one per leaf module (and per fused module with children, such as attention).
        unverified: Python attributes that differ between trials on modules with children (the
            LightningModule itself, blocks): their forward runs with the template's values for every
            trial, so whether they matter can only be checked by comparing outputs (the fused module's
            first-batch check does).
        anchor: name of the parameter fused operators use to see the trial dim (see ``TrialAnchor``).

    Example::

        >>> trials = [nn.Sequential(nn.Linear(2, 2), nn.ELU(alpha)) for alpha in (1.0, 0.5)]
        >>> print(plan_conversion(trials[0], trials).summary())
        fused: 1, grouped: 1, native: 0, rejected: 0
          fused    module '0' (Linear): FusedLinear
          grouped  module '1' (ELU): trials differ in alpha; run once per group of equal settings
    """

    decisions: tuple[ModuleDecision, ...]
    unverified: tuple[str, ...]
    anchor: str | None

    def with_outcome(self, outcome: Outcome) -> list[ModuleDecision]:
        """The decisions with that outcome."""
        return [decision for decision in self.decisions if decision.outcome == outcome]

    def raise_if_rejected(self) -> None:
        """Raises :class:`ConversionError` listing every rejected module, if any."""
        rejected = self.with_outcome("rejected")
        if rejected:
            lines = "\n".join(f"  - {decision}" for decision in rejected)
            raise ConversionError(
                f"hfta cannot fuse these trials:\n{lines}\n"
                "Use backend='loop' (always correct), or make the trials agree on these settings."
            )

    def summary(self) -> str:
        """Counts per outcome, then one line per module that is not left alone silently."""
        counts = ", ".join(f"{o}: {len(self.with_outcome(o))}" for o in ("fused", "grouped", "native", "rejected"))
        lines = [counts]
        lines += [f"  {d.outcome:<8} {d}" for d in self.decisions]
        lines += [f"  unverified {line}" for line in self.unverified]
        return "\n".join(lines)


def _describe_values(modules: Sequence[nn.Module], names: Sequence[str]) -> str:
    return "; ".join(f"{name} = {[getattr(module, name, None) for module in modules]}" for name in names)


def _decide_fusable(
    path: str, module: nn.Module, fused: type[FusedModule], differing: list[str], trials: Sequence[nn.Module]
) -> ModuleDecision:
    type_name = type(module).__name__
    honoured = (*fused.per_trial_attributes, *fused.construction_only_attributes)
    structural = [name for name in differing if name not in honoured]
    if structural:
        reason = (
            f"trials differ in {_describe_values(trials, structural)}, which a fused {type_name} cannot "
            f"honour per trial (it does for: {', '.join(fused.per_trial_attributes) or 'nothing'})"
        )
        return ModuleDecision(path, type_name, "rejected", reason)
    if isinstance(module, nn.Embedding) and module.sparse:
        reason = "sparse=True: sparse gradients cannot be stacked over trials; use sparse=False"
        return ModuleDecision(path, type_name, "rejected", reason)
    if isinstance(module, nn.MultiheadAttention) and (module.bias_k is not None or module.add_zero_attn):
        if differing:
            reason = f"add_bias_kv/add_zero_attn are not fused and trials differ in {', '.join(differing)}"
            return ModuleDecision(path, type_name, "rejected", reason)
        reason = "add_bias_kv/add_zero_attn are not fused; runs under vmap's own rules"
        return ModuleDecision(path, type_name, "native", reason)
    if type(module) in ONLY_WHEN_TRIALS_DIFFER and not set(differing) & set(fused.per_trial_attributes):
        reason = "all trials share its settings; vmap's own elementwise rule is already optimal"
        return ModuleDecision(path, type_name, "native", reason)
    return ModuleDecision(path, type_name, "fused", fused.__name__)


def _decide_other(path: str, module: nn.Module, differing: list[str], trials: Sequence[nn.Module]) -> ModuleDecision:
    type_name = type(module).__name__
    if differing and is_groupable(module):
        reason = f"trials differ in {', '.join(differing)}; run once per group of equal settings"
        return ModuleDecision(path, type_name, "grouped", reason)
    if differing:
        reason = (
            f"trials differ in {_describe_values(trials, differing)}, and no fused operator honours that; "
            "vmap would run every trial with the template's values"
        )
        return ModuleDecision(path, type_name, "rejected", reason)
    if has_tensors(module):
        reason = f"no fused operator for {type_name}; its stacked parameters run under vmap's own rules"
    else:
        reason = "parameter-free; vmap's own rule"
    return ModuleDecision(path, type_name, "native", reason)


def plan_conversion(template: nn.Module, trials: Sequence[nn.Module]) -> ConversionPlan:
    """Decides, without changing anything, what :func:`convert_to_fused` does with each module.

    Args:
        template: the module whose code will run (a copy of one trial).
        trials: the B trial modules, in slot order; same architecture as ``template``.

    Returns:
        The plan; check :meth:`ConversionPlan.raise_if_rejected` or read :meth:`ConversionPlan.summary`.

    Raises:
        ValueError: ``trials`` is empty.
    """
    if not trials:
        raise ValueError("plan_conversion expects at least one trial module, got an empty sequence")
    decisions: list[ModuleDecision] = []
    unverified: list[str] = []
    # torchmetrics metrics never run under the fused backends (their calls are replayed on each trial's own
    # metric afterwards: lightning_hydro/backends/deferred_metrics.py), so they are neither fused nor compared
    atomic_prefixes: list[str] = [f"{path}." for path in metric_paths(template).values()]
    skipped = set(metric_paths(template).values())
    for path, module in template.named_modules():
        if path in skipped:
            continue
        if any(path.startswith(prefix) for prefix in atomic_prefixes):
            continue  # inside a fused module (e.g. attention's out_proj): fused with it
        type_name = type(module).__name__
        found = [_submodule(trial, path) for trial in trials]
        kind = architecture_type(module)
        trial_modules = [other for other in found if other is not None and architecture_type(other) is kind]
        if len(trial_modules) != len(trials):
            mismatched = {
                slot: _type_name(other, kind)
                for slot, other in enumerate(found)
                if other is None or architecture_type(other) is not kind
            }
            reason = f"trials have {mismatched} here (slot: type); all trials must share one architecture"
            decisions.append(ModuleDecision(path, type_name, "rejected", reason))
            continue
        differing = differing_attributes(trial_modules)
        fused = FUSED_OPERATORS.get(type(module))
        if fused is None and any(True for _ in module.children()):
            container = FUSED_CONTAINERS.get(type(module))
            if container is not None:
                reason = f"{container.__name__}: runs its Python path, whose submodules are fused"
                decisions.append(ModuleDecision(path, type_name, "fused", reason))
            if differing:
                unverified.append(f"module '{path}' ({type_name}): {_describe_values(trial_modules, differing)}")
            continue
        if fused is not None:
            atomic_prefixes.append(f"{path}." if path else "")
            decisions.append(_decide_fusable(path, module, fused, differing, trial_modules))
        else:
            decisions.append(_decide_other(path, module, differing, trial_modules))
    anchor = next((name for name, _ in template.named_parameters()), None)
    anchor = anchor or next((name for name, _ in template.named_buffers()), None)
    return ConversionPlan(tuple(decisions), tuple(unverified), anchor)


def architecture_type(module: nn.Module) -> type:
    """The class that says which architecture ``module`` has: for a parametrized module, the class it was made from.

    ``torch.nn.utils.parametrize`` (``parametrizations.weight_norm``, ``spectral_norm``, ``orthogonal``) gives
    each module it changes a class of its own, made for that instance (every trial's ``ParametrizedLinear`` is
    another class); trials built by the same code share the class those were made from, and their
    parametrizations are submodules that conversion compares one by one.

    Example::

        >>> from torch.nn.utils.parametrizations import weight_norm
        >>> a, b = weight_norm(nn.Linear(2, 2)), weight_norm(nn.Linear(2, 2))
        >>> type(a) is type(b), architecture_type(a) is architecture_type(b) is nn.Linear
        (False, True)
    """
    if is_parametrized(module):
        return type(module).__bases__[0]
    return type(module)


def _type_name(module: nn.Module | None, kind: type) -> str:
    """The name of a trial's module type, in full where it reads as the template's (two classes of one name)."""
    other = type(module) if module is None else architecture_type(module)
    return f"{other.__module__}.{other.__qualname__}" if other.__name__ == kind.__name__ else other.__name__


def _submodule(root: nn.Module, path: str) -> nn.Module | None:
    try:
        return root.get_submodule(path)
    except AttributeError:  # reported as type NoneType: the trial has no module there
        return None


def convert_to_fused(template: nn.Module, trials: Sequence[nn.Module], *, inplace: bool = False) -> nn.Module:
    """A copy of ``template`` whose supported modules are fused operators over ``trials``.

    Parameter and buffer names are unchanged and no weight is re-initialised: the copy's own tensors
    are ignored under ``functional_call``, which supplies the trials' stacked state. Per-trial Python
    settings (BatchNorm momentum/eps, dropout p, LeakyReLU slope, Embedding padding_idx, ...) are read
    from ``trials`` now: when the trials change, call :func:`select_trials` (trials removed) or convert
    again (trials added or replaced).

    Args:
        template: the module whose code will run (a copy of one trial).
        trials: the B trial modules, in slot order (row b of the stacked state is ``trials[b]``).
        inplace: convert ``template`` itself instead of a copy.

    Returns:
        The converted model. Run it under ``torch.func.vmap`` over the stacked trial state.

    Raises:
        ConversionError: some module cannot be fused; the message lists each (path, type, why).
        ValueError: ``trials`` is empty.

    Example::

        >>> import torch
        >>> from torch.func import functional_call, stack_module_state, vmap
        >>> trials = [nn.Sequential(nn.Linear(4, 8), nn.Dropout(p), nn.Linear(8, 1)) for p in (0.0, 0.5)]
        >>> model = convert_to_fused(trials[0], trials)
        >>> [type(m).__name__ for m in model]
        ['FusedLinear', 'FusedDropout', 'FusedLinear']
        >>> params, buffers = stack_module_state(trials)
        >>> x = torch.randn(16, 4)
        >>> run = lambda p, b: functional_call(model, (p, b), (x,))
        >>> vmap(run, in_dims=(0, 0), randomness="different")(params, buffers).shape
        torch.Size([2, 16, 1])
    """
    plan = plan_conversion(template, trials)
    plan.raise_if_rejected()
    model = template if inplace else copy.deepcopy(template)
    anchor = None if plan.anchor is None else TrialAnchor(model, plan.anchor)
    for decision in plan.decisions:
        trial_modules = [trial.get_submodule(decision.path) for trial in trials]
        if decision.outcome == "fused":
            module = model.get_submodule(decision.path)
            fused = FUSED_OPERATORS.get(type(module)) or FUSED_CONTAINERS[type(module)]
            fused.fuse(module, trial_modules, path=decision.path, anchor=anchor)
        elif decision.outcome == "grouped":
            differing = differing_attributes(trial_modules)
            grouped = TrialGroupedModule(trial_modules, differing, path=decision.path, anchor=anchor)
            if not decision.path:
                return grouped  # the whole model is one parameter-free module
            _replace_submodule(model, decision.path, grouped)
    return model


def _replace_submodule(root: nn.Module, path: str, replacement: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent_path), name, replacement)


def select_trials(model: nn.Module, slots: Sequence[int]) -> None:
    """Keeps the per-trial settings of the trials in ``slots`` only, in that order.

    Call it when the stacked state is compacted (a trial stopped: its row removed), with the slots of
    the surviving rows. Adding or replacing trials brings new settings: convert the template again.

    Args:
        model: a model returned by :func:`convert_to_fused`.
        slots: old slot indices of the trials to keep, in their new order.

    Raises:
        ValueError: ``slots`` is empty, repeats a slot or names one the model does not have.

    Example::

        >>> trials = [nn.Sequential(nn.BatchNorm1d(2, momentum=m)) for m in (0.1, 0.2, 0.3)]
        >>> model = convert_to_fused(trials[0], trials)
        >>> select_trials(model, [0, 2])
        >>> model[0].setting("momentum").values
        (0.1, 0.3)
    """
    fused = [module for module in model.modules() if isinstance(module, (FusedModule, TrialGroupedModule))]
    count = fused[0].num_trials if fused else None
    if not slots or len(set(slots)) != len(slots) or (count is not None and not all(0 <= s < count for s in slots)):
        raise ValueError(
            f"select_trials expects distinct slots in [0, {count}), got {list(slots)}; pass the slots of the "
            "trials that remain, in their new order"
        )
    for module in fused:
        module.select_trials(slots)
