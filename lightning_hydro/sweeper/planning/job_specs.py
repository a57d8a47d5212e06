"""What each group job is told: its :class:`~lightning_hydro.sweeper.group_spec.GroupSpec` and its launch overrides.

A group's job config is the user's app config with the group's shared values (the search space's fixed
overrides, the partition's non-fusible values) as command-line overrides; each trial's own values (fusible keys,
and the widths a padded group lets differ) travel in the spec, with the trial's seed, the app's ``fused`` options
and, for a search group, the early-stopping settings and the sweep-wide search's section.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig

from lightning_hydro.sweeper.app_config import FUSED_KEY, SEED_KEY, config_section
from lightning_hydro.sweeper.group_spec import (
    EarlyStoppingSpec,
    GroupSpec,
    TrialSpec,
    group_launch_overrides,
    trial_seed,
)
from lightning_hydro.sweeper.planning.grouping import fused_options, padded_in
from lightning_hydro.sweeper.planning.search_space import SearchSpace, override_key
from lightning_hydro.sweeper.planning.settings import SweepSettings
from lightning_hydro.sweeper.planning.study_channel import StudyChannel
from lightning_hydro.sweeper.planning.sweep_search import search_section
from lightning_hydro.sweeper.planning.sweep_state import SweepState
from lightning_hydro.sweeper.planning.trial_groups import Partition, Trial, TrialGroup

__all__ = ["JobSpecs"]


class JobSpecs:
    """Builds each group job's spec and overrides from the sweep's settings, search space and app config.

    Args:
        settings: the validated ``hydra.sweeper`` settings.
        space: the parsed search space.
        config: the app config (its ``seed`` and ``fused`` section are read).
        state: the sweep's plan (its trials and, with a sweep-wide search, each group's quota).
        rung_storage: where every group's early-stopping callback records its rungs.
        rung_namespace: the sweep's name in that store.
        channel: the sweep's one sampler, where freed slots ask it for new configurations.
    """

    def __init__(
        self,
        settings: SweepSettings,
        space: SearchSpace,
        config: DictConfig | None,
        state: SweepState,
        *,
        rung_storage: str,
        rung_namespace: str,
        channel: StudyChannel | None,
    ) -> None:
        self.settings = settings
        self.space = space
        self.config = config
        self.state = state
        self.rung_storage = rung_storage
        self.rung_namespace = rung_namespace
        self.channel = channel
        self.fusible = [k for k in space.keys if k not in settings.non_fusible]

    def search_spec(self, group: TrialGroup) -> GroupSpec:
        """The spec of a search group: its trials, and how they stop early and ask for more."""
        sched = self.settings.scheduler
        early_stopping = EarlyStoppingSpec(
            name=sched.name,
            metric=self.settings.metric,
            mode=self.settings.mode,
            reduction_factor=sched.reduction_factor,
            grace_period=sched.grace_period,
            max_t=sched.max_t,
            options=dict(sched.options),
            storage=self.rung_storage,  # one rung store per sweep: every decision ranks the whole sweep
            namespace=self.rung_namespace,
        )
        search: dict[str, Any] = {}
        if self.channel is not None and group.group_id in self.state.quotas:
            search = search_section(
                self.channel,
                quota=self.state.quotas[group.group_id],
                group=group,
                fusible=self.fusible,
                space=self.space,
                seeds=(self.config_seed(), self.settings.seed),
            )
        spec = self.spec(group, self.trial_overrides(self.trials_of(group), group.partition))
        return dataclasses.replace(spec, early_stopping=early_stopping, search=search)

    def spec(
        self, group: TrialGroup, overrides: Mapping[int, list[str]], trials: Sequence[Trial] | None = None
    ) -> GroupSpec:
        """A group's spec with each trial's ``overrides``; ``trials`` for a probe, whose trials are not planned yet."""
        return GroupSpec(
            group_id=group.group_id,
            kind=group.kind,
            slots=group.slots,
            trials=tuple(TrialSpec(tid, tuple(overrides[tid]), self.seed(tid)) for tid in group.trial_ids),
            fused=fused_options(
                self._fused_options(),
                self.trials_of(group) if trials is None else trials,
                self.padded_in(group.partition),
            ),
        )

    def trial_overrides(
        self, trials: Sequence[Trial], partition: Partition, drop: Sequence[str] = ()
    ) -> dict[int, list[str]]:
        """Each trial's own override lines (fusible keys and the widths its group pads), less ``drop``."""
        keys = [k for k in [*self.fusible, *self.padded_in(partition)] if k not in drop]
        return {t.trial_id: self.space.override_lines(t.configuration.texts, keys) for t in trials}

    def job_overrides(self, group: TrialGroup, extra: Sequence[str] = ()) -> list[str]:
        """A job's overrides: the fixed ones, its partition's values, ``extra`` (wins), Hydra's settings."""
        replaced = {override_key(line) for line in extra}
        shared = [
            *self.space.fixed,
            *self.space.override_lines(dict(group.partition), [k for k, _ in group.partition]),
        ]
        kept = [line for line in shared if override_key(line) not in replaced]
        return [*kept, *extra, *group_launch_overrides(group.group_id)]

    def padded_in(self, partition: Partition) -> list[str]:
        """The searched non-fusible keys a group's trials may differ in: its padded widths."""
        return padded_in(partition, self.settings.non_fusible, self.space.keys)

    def trials_of(self, group: TrialGroup) -> list[Trial]:
        """The planned trials of ``group``."""
        return [self.state.trials[tid] for tid in group.trial_ids]

    def seed(self, trial_id: int) -> int:
        """The trial's seed: the config's ``seed`` (default 0), or one of its own where ``seed: null``."""
        return trial_seed(self.config_seed(), self.settings.seed, trial_id)

    def config_seed(self) -> int | None:
        """The app config's ``seed`` (0 where it has none), or ``None`` where it is not an integer."""
        config_seed = self.config.get(SEED_KEY, 0) if self.config is not None else 0
        return config_seed if isinstance(config_seed, int) else None

    def _fused_options(self) -> dict[str, Any]:
        """The app config's ``fused`` section, with ``hydra.sweeper.compile`` where that section does not set it."""
        fused = config_section(
            self.config.get(FUSED_KEY) if self.config is not None else None,
            what=f"lightning_hydro sweeper: the config's '{FUSED_KEY}'",
        )
        if self.settings.compile and "compile" not in fused:
            fused["compile"] = self.settings.compile
        return fused
