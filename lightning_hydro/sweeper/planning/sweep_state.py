"""The persisted plan of a sweep, so that re-running the same command resumes it.

``<sweep_dir>/lightning_hydro/plan.json`` holds the sweep's *request* (the settings and search space that
define it), every trial asked so far, every group planned, and the fusion limits measured. A group is
finished when its job wrote ``<sweep_dir>/<group_id>/group_result.json``. Re-running with the same
``hydra.sweep.dir`` loads the plan, skips finished groups and relaunches the others; a request that differs
from the stored one is an error, since mixing two searches in one directory would corrupt both.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_hydro.sweeper.group_spec import STATE_DIR, read_group_result
from lightning_hydro.sweeper.json_files import CorruptStateFile, read_json, write_json_atomic
from lightning_hydro.sweeper.planning.search_space import Configuration
from lightning_hydro.sweeper.planning.trial_groups import Partition, Trial, TrialGroup, partition_label

__all__ = ["PLAN_FILE", "SweepState"]

PLAN_FILE = "plan.json"
_VERSION = 1
_PLAN_ADVICE = (
    "It is the sweep's plan (its trials and groups): do NOT delete it alone, since the sweep would be planned "
    "anew and the results of the groups already run attached to the wrong trials. Restore it from a backup, "
    "or start the sweep over: delete the whole sweep directory, or use another hydra.sweep.dir."
)


@dataclass
class SweepState:
    """Trials, groups and fusion limits of one sweep directory.

    Attributes:
        sweep_dir: the sweep directory (``hydra.sweep.dir``).
        request: what defines the sweep; compared on resume.
        trials: every trial asked so far, by id.
        groups: every group planned so far, in launch order.
        fusion_limits: measured limit per partition label (``fusion_limit: auto``).
        quotas: trials each group may start in all, by group id (groups that ask the sweep's sampler).
    """

    sweep_dir: Path
    request: dict[str, Any]
    trials: dict[int, Trial] = field(default_factory=dict)
    groups: list[TrialGroup] = field(default_factory=list)
    fusion_limits: dict[str, int] = field(default_factory=dict)
    quotas: dict[str, int] = field(default_factory=dict)
    _results: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, sweep_dir: Path, request: dict[str, Any]) -> SweepState:
        """Load the sweep stored in ``sweep_dir``, or start a new one there.

        Raises:
            ValueError: if ``sweep_dir`` holds a sweep with a different request.
            CorruptStateFile: if its plan is unreadable.
        """
        path = sweep_dir / STATE_DIR / PLAN_FILE
        try:
            data = read_json(path)
            if data is None:
                return cls(sweep_dir=sweep_dir, request=request)
            return cls._from_json(sweep_dir, request, data)
        except CorruptStateFile as err:
            raise CorruptStateFile(path, err.detail, _PLAN_ADVICE) from err
        except (KeyError, TypeError, AttributeError) as err:
            raise CorruptStateFile(path, f"not a plan: {type(err).__name__}: {err}", _PLAN_ADVICE) from err

    @classmethod
    def _from_json(cls, sweep_dir: Path, request: dict[str, Any], data: dict[str, Any]) -> SweepState:
        stored = data["request"]
        if stored != request:
            changed = sorted(k for k in set(stored) | set(request) if stored.get(k) != request.get(k))
            raise ValueError(
                f"lightning_hydro sweeper: {sweep_dir} holds a different sweep (it differs in: "
                f"{', '.join(changed)}). Re-run with the same settings and search space to resume it; to "
                "start a new sweep, use another hydra.sweep.dir or delete that directory."
            )
        trials = {
            int(t["trial_id"]): Trial(int(t["trial_id"]), Configuration(dict(t["values"]), dict(t["texts"])))
            for t in data["trials"]
        }
        groups = [
            TrialGroup(
                group_id=g["group_id"],
                kind=g["kind"],
                trial_ids=tuple(int(i) for i in g["trial_ids"]),
                slots=int(g["slots"]),
                partition=tuple((k, v) for k, v in g["partition"]),
            )
            for g in data["groups"]
        ]
        limits = {k: int(v) for k, v in data["fusion_limits"].items()}
        quotas = {k: int(v) for k, v in data.get("quotas", {}).items()}
        return cls(sweep_dir, request, trials, groups, limits, quotas)

    def save(self) -> None:
        """Write the plan (atomically)."""
        write_json_atomic(
            self.sweep_dir / STATE_DIR / PLAN_FILE,
            {
                "version": _VERSION,
                "request": self.request,
                "trials": [
                    {"trial_id": t.trial_id, "values": t.configuration.values, "texts": t.configuration.texts}
                    for t in self.trials.values()
                ],
                "groups": [
                    {
                        "group_id": g.group_id,
                        "kind": g.kind,
                        "trial_ids": list(g.trial_ids),
                        "slots": g.slots,
                        "partition": [list(p) for p in g.partition],
                    }
                    for g in self.groups
                ],
                "fusion_limits": self.fusion_limits,
                "quotas": self.quotas,
            },
        )

    def add(self, trials: Iterable[Trial], groups: Iterable[TrialGroup]) -> None:
        """Record newly asked trials and their groups, and save."""
        for trial in trials:
            self.trials[trial.trial_id] = trial
        self.groups.extend(groups)
        self.save()

    def set_fusion_limit(self, partition: Partition, limit: int) -> None:
        """Record the measured fusion limit of ``partition``, and save."""
        self.fusion_limits[partition_label(partition)] = limit
        self.save()

    def fusion_limit(self, partition: Partition) -> int | None:
        """The measured fusion limit of ``partition``, if any."""
        return self.fusion_limits.get(partition_label(partition))

    def job_dir(self, group: TrialGroup) -> Path:
        """The job directory of ``group``."""
        return self.sweep_dir / group.group_id

    def result(self, group: TrialGroup) -> dict[str, Any] | None:
        """The result ``group``'s job wrote, or ``None`` if it has not finished (cached once read)."""
        if group.group_id not in self._results:
            result = read_group_result(self.job_dir(group))
            if result is None:
                return None
            self._results[group.group_id] = result
        return self._results[group.group_id]

    def groups_of_kind(self, kind: str) -> list[TrialGroup]:
        """The planned groups of ``kind`` (``search``, ``retrain`` or ``probe``)."""
        return [g for g in self.groups if g.kind == kind]
