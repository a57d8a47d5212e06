"""The sweeper's side of the sweep-wide search: where the shared stores live, and each group's quota.

With a learning sampler (``tpe`` or an Optuna sampler) and a refilling scheduler, the sweeper asks only the
first configurations (one round): they decide the partitions, and each partition gets ONE group whose quota
is its share of ``n_trials`` (:func:`partition_quotas`) and whose slots are ``min(fusion limit, quota)``. The
group asks the sweep's sampler for the rest of its quota as its slots free (see
:mod:`~lightning_hydro.sweeper.job.group_search`); when it ends, :func:`absorb_asked_trials` adds those trials
to the sweep's plan.

Example::

    >>> partition_quotas({("bs", "32"): 5, ("bs", "64"): 6, ("bs", "128"): 5}, total=32)
    {('bs', '32'): 10, ('bs', '64'): 12, ('bs', '128'): 10}
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from lightning_hydro.sweeper.group_spec import STATE_DIR
from lightning_hydro.sweeper.planning.search_space import SearchSpace
from lightning_hydro.sweeper.planning.study_channel import ChannelSpec, StudyChannel
from lightning_hydro.sweeper.planning.sweep_state import SweepState
from lightning_hydro.sweeper.planning.trial_groups import Trial, TrialGroup

__all__ = [
    "RUNG_FILE",
    "SAMPLER_FILE",
    "absorb_asked_trials",
    "partition_quotas",
    "rung_storage",
    "sampler_storage",
    "search_section",
    "sweep_name",
]

RUNG_FILE = "rungs.db"
SAMPLER_FILE = "sampler.journal"
K = TypeVar("K")


def rung_storage(sweep_dir: Path, url: str | None) -> str:
    """The sweep's rung store: ``url`` (``hydra.sweeper.storage``), else ``<sweep_dir>/lightning_hydro/rungs.db``."""
    return url if url is not None else str(sweep_dir / STATE_DIR / RUNG_FILE)


def sampler_storage(sweep_dir: Path, url: str | None) -> str:
    """The sweep's sampler storage: ``url``, else the journal file ``<sweep_dir>/lightning_hydro/sampler.journal``."""
    return url if url is not None else str(sweep_dir / STATE_DIR / SAMPLER_FILE)


def sweep_name(sweep_dir: Path, url: str | None) -> str:
    """The sweep's name in its stores: ``sweep`` in files of its own, else one derived from its directory.

    Sweeps that share a database (``hydra.sweeper.storage``) must not see each other's records or trials.
    """
    if url is None:
        return "sweep"
    return "sweep-" + hashlib.sha256(str(sweep_dir.absolute()).encode()).hexdigest()[:12]


def partition_quotas(counts: Mapping[K, int], total: int) -> dict[K, int]:
    """Share ``total`` trials among partitions in proportion to ``counts`` (largest remainders; each keeps its count).

    Raises:
        ValueError: if ``total`` is below the sum of ``counts``.
    """
    asked = sum(counts.values())
    if total < asked:
        raise ValueError(f"partition_quotas: total={total} is below the {asked} trials already asked.")
    if not asked:
        return {}
    exact = {key: total * n / asked for key, n in counts.items()}
    quotas = {key: max(counts[key], int(share)) for key, share in exact.items()}
    by_remainder = sorted(counts, key=lambda key: exact[key] - int(exact[key]), reverse=True)
    for key in by_remainder[: max(0, total - sum(quotas.values()))]:
        quotas[key] += 1
    return quotas


def search_section(
    channel: StudyChannel,
    *,
    quota: int,
    group: TrialGroup,
    fusible: Sequence[str],
    space: SearchSpace,
    seeds: tuple[int | None, int],
) -> dict[str, Any]:
    """The ``search`` section of a group's spec (read back by ``GroupSearch.from_spec`` in the job)."""
    spec: ChannelSpec = channel.spec
    return {
        "channel": spec.to_json(),
        "quota": quota,
        "planned": len(group.trial_ids),
        "partition": [list(pair) for pair in group.partition],
        "fusible": list(fusible),
        "prefixes": {dim.key: dim.prefix for dim in space.dimensions},
        "seeds": list(seeds),
    }


def absorb_asked_trials(state: SweepState, group: TrialGroup, channel: StudyChannel) -> TrialGroup:
    """Add the trials that ``group``'s job asked of the sampler to the plan (and to the group); return the group."""
    result = state.result(group) or {}
    new_ids = [int(k) for k in result.get("trials", {}) if int(k) not in group.trial_ids]
    if not new_ids:
        return group
    known = channel.configurations()
    grown = dataclasses.replace(group, trial_ids=(*group.trial_ids, *sorted(new_ids)))
    state.groups[state.groups.index(group)] = grown
    state.add([Trial(tid, known[tid]) for tid in sorted(new_ids)], [])
    return grown
