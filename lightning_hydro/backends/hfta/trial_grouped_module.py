"""Parameter-free torch modules whose trials differ in a Python setting, run group by group.

Trials are grouped by equal settings (e.g. ELU ``alpha``); each group runs one copy of the module
under torch's own vmap over that group's trials, and the outputs are put back in slot order. With k
distinct settings this costs k calls instead of one, and it is exact for any module that maps one
tensor to one tensor, since each copy sees the same per-trial tensors the trial itself would.
Dropout and LeakyReLU, the common cases, have truly fused operators instead.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.func import vmap

from lightning_hydro.backends.hfta.errors import FusedCallError
from lightning_hydro.backends.hfta.fused_operator import (
    InDims,
    TrialAnchor,
    TrialFunction,
    VmapInfo,
    trials_first,
)
from lightning_hydro.backends.hfta.per_trial import values_equal


def group_trials(trials: Sequence[nn.Module], names: Sequence[str]) -> list[list[int]]:
    """Slots of ``trials`` grouped by equal values of attributes ``names``, in order of first appearance.

    Example::

        >>> group_trials([nn.ELU(1.0), nn.ELU(0.5), nn.ELU(1.0)], ["alpha"])
        [[0, 2], [1]]
    """
    groups: list[list[int]] = []
    for slot, trial in enumerate(trials):
        for group in groups:
            first = trials[group[0]]
            if all(values_equal(getattr(trial, name), getattr(first, name)) for name in names):
                group.append(slot)
                break
        else:
            groups.append([slot])
    return groups


def grouped_rule(
    info: VmapInfo, in_dims: InDims, x: Tensor, anchor: Tensor | None, module: TrialGroupedModule
) -> tuple[Tensor, int]:
    """The rule: each group's module under vmap over that group's trials; returns (output ``[B, ...]``, 0)."""
    if info.batch_size != module.num_trials:
        raise FusedCallError(
            f"TrialGroupedModule at '{module.module_path}' was converted for {module.num_trials} trials but "
            f"vmap runs over {info.batch_size}; convert the template again for the new set of trials"
        )
    pieces: list[Tensor] = []
    for slots, representative in zip(module.slot_groups, module.representatives):
        representative.train(module.training)
        index = torch.tensor(slots, device=x.device)
        # A shared input is expanded too, so that random modules draw independently for each trial.
        group_input = trials_first(x, in_dims[0], info.batch_size).index_select(0, index)
        out = vmap(representative, randomness=info.randomness)(group_input)
        if not isinstance(out, Tensor):
            raise FusedCallError(
                f"{type(representative).__name__} at '{module.module_path}' returned "
                f"{type(out).__name__}; only modules that return one tensor can run grouped by trial settings"
            )
        pieces.append(out)
    order = torch.tensor([slot for slots in module.slot_groups for slot in slots], device=x.device)
    return torch.cat(pieces).index_select(0, torch.argsort(order)), 0


class TrialGroupedFunction(TrialFunction):
    """Autograd Function whose vmap rule is :func:`grouped_rule`."""

    vmap = staticmethod(grouped_rule)


class TrialGroupedModule(nn.Module):
    """Stands in for a parameter-free module whose trials differ in Python settings.

    Args:
        trials: the module of each trial, in slot order (copied, one per group).
        differing: names of the attributes that differ between trials.
        path: the module's dotted path, for error messages.
        anchor: where to find a trial-batched tensor when the input is the shared batch.

    Example::

        >>> from torch.func import vmap
        >>> grouped = TrialGroupedModule([nn.ELU(1.0), nn.ELU(0.5), nn.ELU(1.0)], ["alpha"])
        >>> vmap(grouped)(-torch.ones(3, 1) * 10)
        tensor([[-1.0000],
                [-0.5000],
                [-1.0000]])
    """

    def __init__(
        self,
        trials: Sequence[nn.Module],
        differing: Sequence[str],
        *,
        path: str = "",
        anchor: TrialAnchor | None = None,
    ) -> None:
        super().__init__()
        self.differing = tuple(differing)
        self.module_path = path
        self.trial_anchor = anchor
        self.bind_trials(trials)

    def bind_trials(self, trials: Sequence[nn.Module]) -> None:
        """Regroups for ``trials`` (slot order). The copies are kept unregistered: they hold no state."""
        self.slot_groups = group_trials(trials, self.differing)
        self.representatives = [copy.deepcopy(trials[slots[0]]) for slots in self.slot_groups]
        self.num_trials = len(trials)

    def select_trials(self, slots: Sequence[int]) -> None:
        """Keeps the trials in ``slots`` only, in that order (after trials are removed)."""
        kept = {old: new for new, old in enumerate(slots)}
        pairs = [
            ([kept[slot] for slot in group if slot in kept], representative)
            for group, representative in zip(self.slot_groups, self.representatives)
        ]
        pairs = [(group, representative) for group, representative in pairs if group]
        self.slot_groups = [group for group, _ in pairs]
        self.representatives = [representative for _, representative in pairs]
        self.num_trials = len(slots)

    def forward(self, input: Tensor) -> Tensor:
        """Each trial's input through that trial's own settings."""
        anchor = None if self.trial_anchor is None else self.trial_anchor()
        return TrialGroupedFunction.apply(input, anchor, self)
