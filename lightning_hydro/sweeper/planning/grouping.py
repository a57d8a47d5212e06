"""Padded groups in a sweep: trials that differ only in searched hidden widths share one group.

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

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightning_hydro.stacking.width_plan import WidthPaddingError
from lightning_hydro.sweeper.planning.trial_groups import Partition, Trial, TrialGroup, partition_label, partition_of
from lightning_hydro.sweeper.planning.width_groups import group_by_padded_cost

__all__ = ["fused_options", "launch_report", "needs_padding", "plan_padded_groups", "width_keys"]

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
    return isinstance(err, WidthPaddingError) or _REFUSAL in str(err)


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
