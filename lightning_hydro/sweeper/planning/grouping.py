"""Group planning, the entry: a round's trials become the groups that train them (:class:`GroupPlanner`).

Trials fuse only when they share every non-fusible value: a *partition*. Each round, :class:`GroupPlanner` chooses
plain or padded groups, caps them by the fusion limit (a number, or measured per partition for ``auto``:
:mod:`~lightning_hydro.sweeper.planning.fusion_limit`), gives each group its quota of a sweep-wide search, and adds
them to the plan. Plain groups are cut by :func:`~lightning_hydro.sweeper.planning.trial_groups.plan_groups`; padded
ones by :func:`plan_padded_groups` below.

Padded groups: trials that differ only in searched hidden widths share one group.
With ``hydra.sweeper.pad_widths`` (default true) a non-fusible key under ``model.`` whose searched values are
all integers is a *width key*: it no longer splits trials into partitions. Inside each partition of the other
non-fusible keys, trials are cut by :func:`~lightning_hydro.sweeper.planning.width_groups.group_by_padded_cost` (similar
widths together, padding overhead at most ``hydra.sweeper.max_padding_overhead``), and each group's job fuses
its trials with ``pad_widths=True`` when their widths differ. Each trial's widths then travel with its own
overrides, not the group's.

Example::

    >>> from lightning_hydro.sweeper.planning.search_space import Configuration
    >>> confs = [{"model.h": 32, "data.batch_size": 8}, {"model.h": 64, "data.batch_size": 8}]
    >>> trials = [Trial(i, Configuration(c, {k: str(v) for k, v in c.items()})) for i, c in enumerate(confs)]
    >>> width_keys(trials, ["model.h", "data.batch_size"])
    ['model.h']
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightning_hydro.sweeper.planning.fusion_report import warn_if_nothing_fuses
from lightning_hydro.sweeper.planning.settings import SweepSettings
from lightning_hydro.sweeper.planning.sweep_search import partition_quotas
from lightning_hydro.sweeper.planning.sweep_state import SweepState
from lightning_hydro.sweeper.planning.trial_groups import (
    Partition,
    Trial,
    TrialGroup,
    partition_label,
    partition_of,
    plan_groups,
)
from lightning_hydro.sweeper.planning.width_groups import group_by_padded_cost

__all__ = [
    "GroupPlanner",
    "fused_options",
    "is_width_refusal",
    "launch_report",
    "needs_padding",
    "padded_in",
    "plan_padded_groups",
    "split_refused",
    "width_keys",
]

log = logging.getLogger(__name__)


def width_keys(trials: Sequence[Trial], non_fusible: Sequence[str]) -> list[str]:
    """The non-fusible keys under ``model.`` whose values are integers in every trial that sets them."""
    found = []
    for key in non_fusible:
        if not key.startswith("model."):
            continue
        values = [t.configuration.values[key] for t in trials if key in t.configuration.values]
        if values and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
            found.append(key)
    return found


def plan_padded_groups(
    trials: Sequence[Trial],
    *,
    non_fusible: Sequence[str],
    widths: Sequence[str],
    fusion_limit: Callable[[Partition], int],
    refill: bool,
    max_overhead: float,
    first_index: int = 0,
) -> tuple[list[TrialGroup], dict[str, float]]:
    """Partition by the non-fusible keys other than ``widths``, then cut each partition by padded cost.

    Args:
        trials: the trials to place, in sampling order.
        non_fusible: every non-fusible key (``widths`` among them).
        widths: the width keys: they may differ within a group.
        fusion_limit: the most trials trained at once for a partition (>= 1).
        refill: groups are cut by overhead alone and train ``fusion_limit`` trials at once, the rest waiting.
        max_overhead: the largest padding overhead of a group.
        first_index: number of the first group.

    Returns:
        The groups and, by group id, each group's padding overhead (0.0: no padding).

    Raises:
        ValueError: if ``fusion_limit`` returns a number below 1.
    """
    others = [k for k in non_fusible if k not in widths]
    partitions: dict[Partition, list[Trial]] = {}
    for trial in trials:
        partitions.setdefault(partition_of(trial.configuration, others), []).append(trial)
    groups: list[TrialGroup] = []
    overheads: dict[str, float] = {}
    for partition, members in partitions.items():
        limit = fusion_limit(partition)
        if limit < 1:
            raise ValueError(
                f"plan_padded_groups: the fusion limit of partition '{partition_label(partition)}' must be >= 1, "
                f"got {limit}."
            )
        sizes = {t.trial_id: {k: int(t.configuration.values.get(k, 1)) for k in widths} for t in members}
        cut = group_by_padded_cost(sizes, max_overhead=max_overhead, max_size=len(members) if refill else limit)
        for width_group in cut:
            group_id = f"group_{first_index + len(groups):04d}"
            ids = width_group.trial_ids
            groups.append(TrialGroup(group_id, "search", ids, min(limit, len(ids)), partition))
            overheads[group_id] = width_group.overhead
    return groups, overheads


def launch_report(groups: Sequence[TrialGroup], widths: Sequence[str], overheads: dict[str, float]) -> str:
    """The launch line: which keys are padded and each group's padding overhead."""
    shown = ", ".join(f"{g.group_id}: {len(g.trial_ids)} trials, +{overheads.get(g.group_id, 0.0):.0%}" for g in groups)
    return (
        f"lightning_hydro sweeper: pads the widths {', '.join(widths)} (hydra.sweeper.pad_widths=true): trials "
        f"that differ only in them fuse, zero-padded to their group's largest; padding overhead per group: {shown}"
    )


def needs_padding(trials: Sequence[Trial], widths: Sequence[str]) -> bool:
    """Whether the trials' widths differ (their job then fuses with ``pad_widths=True``)."""
    return any(len({t.configuration.texts.get(k) for t in trials}) > 1 for k in widths)


def fused_options(fused: Mapping[str, Any], trials: Sequence[Trial], widths: Sequence[str]) -> dict[str, Any]:
    """A group job's ``fused`` options: the app config's, with ``pad_widths: true`` when its widths differ."""
    options = dict(fused)
    if needs_padding(trials, widths):
        options["pad_widths"] = True
    return options


_REFUSAL = "zero-padding would not compute exactly"


def is_width_refusal(err: BaseException) -> bool:
    """Whether a group job failed because the width plan refused to pad its trials (any launcher)."""
    # A WidthPaddingError exists only where its module is loaded (by the job's width plan, or by unpickling the
    # error a job sent back): looking it up there keeps torch, which that module needs, out of the sweeper's process.
    width_plan = sys.modules.get("lightning_hydro.stacking.width_plan")
    refused = width_plan is not None and isinstance(err, width_plan.WidthPaddingError)
    return refused or _REFUSAL in str(err)


def split_refused(group: TrialGroup, trials: Sequence[Trial], widths: Sequence[str]) -> list[TrialGroup]:
    """Split a group whose padding was refused into identical-width groups (``<group_id>_w<i>``).

    Each part's partition gains the width values its trials share, so they reach the job as group overrides.

    Example::

        >>> from lightning_hydro.sweeper.planning.search_space import Configuration
        >>> trials = [Trial(i, Configuration({"model.h": h}, {"model.h": str(h)})) for i, h in enumerate([8, 16, 8])]
        >>> parts = split_refused(TrialGroup("group_0000", "search", (0, 1, 2), 3, ()), trials, ["model.h"])
        >>> [(g.group_id, g.trial_ids, g.slots, g.partition) for g in parts]
        [('group_0000_w0', (0, 2), 2, (('model.h', '8'),)), ('group_0000_w1', (1,), 1, (('model.h', '16'),))]
    """
    parts: dict[Partition, list[int]] = {}
    for trial in trials:
        parts.setdefault(partition_of(trial.configuration, widths), []).append(trial.trial_id)
    return [
        TrialGroup(f"{group.group_id}_w{i}", group.kind, tuple(ids), min(group.slots, len(ids)), group.partition + part)
        for i, (part, ids) in enumerate(parts.items())
    ]


def padded_in(partition: Partition, non_fusible: Sequence[str], searched: Sequence[str]) -> list[str]:
    """The searched non-fusible keys a group of ``partition`` leaves free: its padded widths (none if plain).

    Example::

        >>> padded_in((("data.batch_size", "8"),), ["data.batch_size", "model.h"], ["data.batch_size", "model.h"])
        ['model.h']
    """
    shared = dict(partition)
    return [k for k in non_fusible if k in searched and k not in shared]


class GroupPlanner:
    """Plans each round's groups and keeps the fusion limits they are capped by.

    A round goes: :meth:`choose_widths` (which width keys the round pads), then, for ``fusion_limit: auto``,
    the sweeper probes each partition of :meth:`splitting_keys` whose limit is not known yet, then :meth:`plan`.

    Args:
        settings: the validated ``hydra.sweeper`` settings.
        state: the sweep's plan, which :meth:`plan` adds the round's trials and groups to.
        searched: the search space's keys.
        continuous: a sweep-wide search (freed slots ask the sweep's sampler): each partition gets one group with a
            quota, and no widths are padded (a freed slot may ask for any width).
    """

    def __init__(
        self, settings: SweepSettings, state: SweepState, searched: Sequence[str], *, continuous: bool
    ) -> None:
        self.settings = settings
        self.state = state
        self.searched = list(searched)
        self.continuous = continuous
        self.padded_keys: list[str] = []

    def choose_widths(self, trials: Sequence[Trial]) -> list[str]:
        """Choose the width keys this round pads (none without ``pad_widths`` or in a sweep-wide search)."""
        padding = self.settings.pad_widths and not self.continuous
        self.padded_keys = width_keys(trials, self.settings.non_fusible) if padding else []
        return self.padded_keys

    def splitting_keys(self) -> list[str]:
        """The non-fusible keys that split this round's trials into partitions (the padded widths do not)."""
        return [k for k in self.settings.non_fusible if k not in self.padded_keys]

    def plan(self, trials: Sequence[Trial], *, n_target: int) -> list[TrialGroup]:
        """Group the round's ``trials`` (plain or padded), add them to the plan, and log the groups.

        Args:
            trials: the round's trials, in sampling order.
            n_target: the trials the sweep asks for in all (a sweep-wide search's quotas share out the rest).
        """
        refill = self.settings.scheduler.name != "none" and self.settings.scheduler.refill
        first_index = len(self.state.groups_of_kind("search"))
        if self.padded_keys:
            groups, overheads = plan_padded_groups(
                trials,
                non_fusible=self.settings.non_fusible,
                widths=self.padded_keys,
                fusion_limit=self.fusion_limit,
                refill=refill,
                max_overhead=self.settings.max_padding_overhead,
                first_index=first_index,
            )
            log.info("%s", launch_report(groups, self.padded_keys, overheads))
        else:
            groups = plan_groups(
                trials,
                non_fusible=self.settings.non_fusible,
                fusion_limit=self.fusion_limit,
                refill=refill,
                first_index=first_index,
            )
        if self.continuous:  # each partition's group asks for its share of the rest as slots free
            groups = self._with_quotas(groups, asked=len(self.state.trials) + len(trials), n_target=n_target)
        self.state.add(trials, groups)
        warn_if_nothing_fuses(groups, self.splitting_keys(), self.searched)
        sizes = ", ".join(f"{g.group_id}: {len(g.trial_ids)} [{partition_label(g.partition)}]" for g in groups)
        log.info("lightning_hydro: %d new trials in %d groups (%s)", len(trials), len(groups), sizes)
        return groups

    def fusion_limit(self, partition: Partition) -> int:
        """The most trials of ``partition`` trained at once: the setting, or the limit measured for it."""
        limit = self.settings.fusion_limit
        if isinstance(limit, int):
            return limit
        measured = self.state.fusion_limit(partition)
        if measured is None:  # pragma: no cover - the sweeper probes every partition before it plans
            raise RuntimeError(f"no fusion limit measured for {partition_label(partition)}")
        return measured

    def _with_quotas(self, groups: list[TrialGroup], *, asked: int, n_target: int) -> list[TrialGroup]:
        """Give each group its partition's share of the trials not asked yet; slots: min(fusion limit, quota)."""
        counts = {g.group_id: len(g.trial_ids) for g in groups}
        quotas = partition_quotas(counts, sum(counts.values()) + max(0, n_target - asked))
        self.state.quotas.update(quotas)
        return [dataclasses.replace(g, slots=min(self.fusion_limit(g.partition), quotas[g.group_id])) for g in groups]
