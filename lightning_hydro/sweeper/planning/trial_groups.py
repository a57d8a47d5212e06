"""Trial groups: configurations partitioned by their non-fusible values, each group capped by a fusion limit.

Trials fuse only when they share every non-fusible value (batch size, width, ...): a *partition*. A
partition of ``n`` trials under fusion limit ``F`` becomes ``ceil(n / F)`` groups of nearly equal size
(20 trials, F=16: two groups of 10, not 16 + 4), each one job. With ``refill`` (early stopping that frees
slots) a partition becomes ONE group with ``F`` slots: its other trials wait and fill freed slots.

Example::

    >>> from lightning_hydro.sweeper.planning.search_space import Configuration
    >>> sizes = [32, 64, 32, 32]
    >>> trials = [Trial(i, Configuration({"bs": bs}, {"bs": str(bs)})) for i, bs in enumerate(sizes)]
    >>> groups = plan_groups(trials, non_fusible=["bs"], fusion_limit=lambda p: 2, refill=False)
    >>> [(g.group_id, g.trial_ids, g.slots) for g in groups]
    [('group_0000', (0, 2), 2), ('group_0001', (3,), 1), ('group_0002', (1,), 1)]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lightning_hydro.sweeper.group_spec import GroupKind
from lightning_hydro.sweeper.planning.search_space import Configuration

__all__ = ["Partition", "Trial", "TrialGroup", "partition_label", "partition_of", "plan_groups"]

Partition = tuple[tuple[str, str], ...]
"""The non-fusible (key, override text) pairs that a partition's trials share, in key order."""


@dataclass(frozen=True)
class Trial:
    """A configuration with its sweep-wide id."""

    trial_id: int
    configuration: Configuration


@dataclass(frozen=True)
class TrialGroup:
    """One job: trials of one partition, at most ``slots`` of them training at once.

    Attributes:
        group_id: unique in the sweep; also the job's directory under the sweep directory.
        kind: ``search`` (a group of the search), ``retrain`` (a final full-scale job) or ``probe``
            (measures the fusion limit of a partition).
        trial_ids: the group's trials, in the order they start.
        slots: trials trained at once (the fused width B); the rest wait for a freed slot.
        partition: the non-fusible values shared by the group's trials.
    """

    group_id: str
    kind: GroupKind
    trial_ids: tuple[int, ...]
    slots: int
    partition: Partition


def partition_of(configuration: Configuration, non_fusible: Sequence[str]) -> Partition:
    """Return the non-fusible (key, text) pairs of ``configuration`` (keys it does not sweep are skipped)."""
    return tuple((key, configuration.texts[key]) for key in non_fusible if key in configuration.texts)


def partition_label(partition: Partition) -> str:
    """A readable name, e.g. ``data.batch_size=32 model.hidden_dim=64`` (``all`` for the empty partition)."""
    return " ".join(f"{key}={text}" for key, text in partition) or "all"


def plan_groups(
    trials: Sequence[Trial],
    *,
    non_fusible: Sequence[str],
    fusion_limit: Callable[[Partition], int],
    refill: bool,
    first_index: int = 0,
    prefix: str = "group",
) -> list[TrialGroup]:
    """Partition ``trials`` by their non-fusible values and split each partition into capped groups.

    Args:
        trials: the trials to place, in sampling order.
        non_fusible: keys whose values must be equal within a group.
        fusion_limit: the most trials fused at once for a partition (>= 1).
        refill: one group per partition, with the extra trials waiting for freed slots.
        first_index: number of the first group (ids continue across rounds and resumes).
        prefix: group ids are ``f"{prefix}_{index:04d}"``.

    Raises:
        ValueError: if ``fusion_limit`` returns a number below 1.
    """
    partitions: dict[Partition, list[int]] = {}
    for trial in trials:
        partitions.setdefault(partition_of(trial.configuration, non_fusible), []).append(trial.trial_id)
    groups: list[TrialGroup] = []
    for partition, ids in partitions.items():
        limit = fusion_limit(partition)
        if limit < 1:
            raise ValueError(
                f"plan_groups: the fusion limit of partition '{partition_label(partition)}' must be >= 1, got {limit}."
            )
        chunks = [ids] if refill else _balanced_chunks(ids, limit)
        for chunk in chunks:
            group_id = f"{prefix}_{first_index + len(groups):04d}"
            groups.append(TrialGroup(group_id, "search", tuple(chunk), min(limit, len(chunk)), partition))
    return groups


def _balanced_chunks(ids: Sequence[int], limit: int) -> list[list[int]]:
    n_chunks = math.ceil(len(ids) / limit)
    base, extra = divmod(len(ids), n_chunks)
    chunks, start = [], 0
    for i in range(n_chunks):
        size = base + (1 if i < extra else 0)
        chunks.append(list(ids[start : start + size]))
        start += size
    return chunks
