"""The contract between the sweeper and a job: which trials a job trains, and where it reports them.

A job's config stays an ordinary config of the user's app: the sweeper launches each group with the
group's shared (non-fusible and fixed) overrides plus two of Hydra's own settings:

- ``hydra.sweep.subdir=<group_id>``: the job's directory, stable across resumes;
- ``++hydra.job.env_set.LIGHTNING_HYDRO_GROUP=<group_id>``: Hydra sets this environment variable in the
  job, which then reads ``<sweep_dir>/lightning_hydro/groups/<group_id>.json`` (a :class:`GroupSpec`:
  the trials, each with its own fusible overrides, the number of slots, the early-stopping settings).

When done, the job writes ``<job_dir>/group_result.json``; the sweeper reads it, also after a resume.
The sweep directory must therefore be on a file system shared by the sweeper and its jobs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import InitVar, asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from lightning_hydro._deprecation import removal_version
from lightning_hydro.sweeper.json_files import CorruptStateFile, read_json, read_json_or_redo, write_json_atomic

__all__ = [
    "ERROR_FILE",
    "GROUP_ENV",
    "RESULT_FILE",
    "STATE_DIR",
    "EarlyStoppingSpec",
    "GroupKind",
    "GroupSpec",
    "TrialSpec",
    "group_launch_overrides",
    "job_dirs",
    "read_group_result",
    "read_group_spec",
    "spec_path",
    "trial_seed",
    "write_group_result",
]

GROUP_ENV = "LIGHTNING_HYDRO_GROUP"
STATE_DIR = "lightning_hydro"
RESULT_FILE = "group_result.json"
ERROR_FILE = "job_error.txt"
"""A failed job's traceback, in its job directory: written by the job, logged by the sweeper."""

GroupKind = Literal["search", "retrain", "probe"]


def trial_seed(config_seed: int | None, sweep_seed: int, trial_id: int) -> int:
    """The seed a trial's module is built with: the config's ``seed``, or one derived from the sweep's.

    A ``seed: null`` config (lightning-hydra-template's default) gives each trial its own reproducible seed.

    Example::

        >>> trial_seed(7, 0, 3), trial_seed(None, 0, 3) == trial_seed(None, 0, 3) != trial_seed(None, 0, 4)
        (7, True)
    """
    if config_seed is not None:
        return int(config_seed)
    return (sweep_seed * 1_000_003 + 7919 * (trial_id + 1)) % (2**31 - 1)


@dataclass(frozen=True)
class TrialSpec:
    """A trial of a group: its id and the override lines that make its config from the job's config."""

    trial_id: int
    overrides: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class EarlyStoppingSpec:
    """Early stopping inside a group; ``name == "none"`` trains every trial to ``trainer.max_epochs``.

    ``grace_period`` and ``max_t`` are the callbacks' arguments of those names (epochs; ``max_t=None``: the
    trainer's ``max_epochs``). ``storage`` is the sweep's rung store (a SQLite path or a database URL) that
    every group shares, so that decisions rank a trial against every trial of the sweep; ``None``: the group's
    own, in memory. ``namespace`` is the sweep's name in that store. ``min_budget``, ``max_budget`` and
    ``name="hypersched"``, the old names of ``grace_period``, ``max_t`` and ``"deadline"``, are accepted for one
    release with a ``DeprecationWarning``.
    """

    name: str = "none"
    metric: str = "val_loss"
    mode: str = "min"
    reduction_factor: float = 3.0
    grace_period: int = 1
    max_t: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    storage: str | None = None
    namespace: str = "sweep"
    min_budget: InitVar[int | None] = None
    max_budget: InitVar[int | None] = None

    def __post_init__(self, min_budget: int | None, max_budget: int | None) -> None:
        renamed: dict[str, tuple[str, object]] = {}
        if min_budget is not None:
            renamed["min_budget"] = ("grace_period", min_budget)
        if max_budget is not None:
            renamed["max_budget"] = ("max_t", max_budget)
        if self.name == "hypersched":
            renamed["name='hypersched'"] = ("name", "deadline")
        for old, (new, value) in renamed.items():
            warnings.warn(
                f"EarlyStoppingSpec({old}) is renamed {new} (the callbacks' name); pass {new}={value!r}. The old "
                f"name will be removed in {removal_version()}.",
                DeprecationWarning,
                stacklevel=3,
            )
            object.__setattr__(self, new, value)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EarlyStoppingSpec:
        """Inverse of ``asdict``; reads the old names in group specs written by earlier sweeps without a warning."""
        data = dict(data)
        for old, new in (("min_budget", "grace_period"), ("max_budget", "max_t")):
            if old in data:
                data[new] = data.pop(old)
        if data.get("name") == "hypersched":
            data["name"] = "deadline"
        return cls(**data)


@dataclass(frozen=True)
class GroupSpec:
    """What one job trains.

    Attributes:
        group_id: the group's id, also its job directory name.
        kind: ``search``, ``retrain`` or ``probe``.
        slots: trials trained at once; trials beyond the first ``slots`` wait for a freed slot.
        trials: the group's trials, in start order.
        early_stopping: the early-stopping settings of the group.
        probe: ``{"safety_margin": ..., "max_limit": ...}`` for a probe group, else empty.
        fused: ``FusedLightningModule`` options for a job whose own task function builds the group
            (``backend``, ``optimizer_path``, ``deterministic``, ``pad_widths``: the app config's ``fused``
            section).
        search: the group's part in the sweep-wide search (see
            :class:`~lightning_hydro.sweeper.job.group_search.GroupSearch`): its quota of trials, its partition and
            the sweep's sampler; empty when freed slots take only the group's planned trials.
        launch: the Hydra overrides the job was launched with; a rank that Lightning's DDP re-launches runs the
            job again with them (see :mod:`~lightning_hydro.sweeper.job.rank_relaunch`).
    """

    group_id: str
    kind: GroupKind
    slots: int
    trials: tuple[TrialSpec, ...]
    early_stopping: EarlyStoppingSpec = field(default_factory=EarlyStoppingSpec)
    probe: dict[str, Any] = field(default_factory=dict)
    fused: dict[str, Any] = field(default_factory=dict)
    search: dict[str, Any] = field(default_factory=dict)
    launch: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GroupSpec:
        """Inverse of :meth:`to_json`."""
        return cls(
            group_id=data["group_id"],
            kind=data["kind"],
            slots=int(data["slots"]),
            trials=tuple(TrialSpec(int(t["trial_id"]), tuple(t["overrides"]), t.get("seed")) for t in data["trials"]),
            early_stopping=EarlyStoppingSpec.from_json(data["early_stopping"]),
            probe=dict(data.get("probe", {})),
            fused=dict(data.get("fused", {})),
            search=dict(data.get("search", {})),
            launch=tuple(data.get("launch", ())),
        )


def spec_path(sweep_dir: Path, group_id: str) -> Path:
    """Where the spec of ``group_id`` lives."""
    return sweep_dir / STATE_DIR / "groups" / f"{group_id}.json"


def group_launch_overrides(group_id: str) -> list[str]:
    """The Hydra overrides that tell a job its group and put it in its own directory."""
    return [f"hydra.sweep.subdir={group_id}", f"++hydra.job.env_set.{GROUP_ENV}={group_id}"]


def read_group_spec(sweep_dir: Path, group_id: str | None = None) -> GroupSpec | None:
    """The spec of ``group_id`` (default: the group this job runs), or ``None`` outside a sweep group (a plain run).

    Raises:
        FileNotFoundError: if the environment names a group whose spec file is missing.
    """
    group_id = group_id or os.environ.get(GROUP_ENV)
    if not group_id:
        return None
    path = spec_path(sweep_dir, group_id)
    try:
        data = read_json(path)
    except CorruptStateFile as err:
        raise CorruptStateFile(
            path,
            err.detail,
            "It is the spec of the group this job runs; it is safe to delete: re-run the sweep command (same "
            "hydra.sweep.dir) and the sweeper writes it again when it launches the group.",
        ) from err
    if data is None:
        raise FileNotFoundError(
            f"{GROUP_ENV}={group_id} but {path} does not exist. The sweep directory must be shared by the "
            f"sweeper and its jobs; outside a sweep, unset {GROUP_ENV}."
        )
    return GroupSpec.from_json(data)


def job_dirs() -> tuple[Path, Path | None]:
    """The job's output directory, and the sweep directory its group spec would be in (outside Hydra: cwd)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return Path.cwd(), None
    hydra_cfg = HydraConfig.get()
    # A relative sweep dir is relative to where the app was started, not to the job's directory
    # (the job may have changed into it: hydra.job.chdir=true).
    return Path(hydra_cfg.runtime.output_dir), Path(hydra_cfg.runtime.cwd) / hydra_cfg.sweep.dir


def write_group_result(job_dir: Path, result: dict[str, Any]) -> None:
    """Write a finished group's result (atomically) into its job directory."""
    write_json_atomic(job_dir / RESULT_FILE, result)


def read_group_result(job_dir: Path) -> dict[str, Any] | None:
    """The result a finished group wrote, or ``None`` if the group has not finished.

    An unreadable result is set aside (``group_result.json.corrupt``) with a warning, and the group counts as
    unfinished: relaunched, it reads its finished fused rounds back from their ``group_fit.json``.
    """
    result = read_json_or_redo(
        job_dir / RESULT_FILE, "the group is relaunched (its finished fused rounds are read back, not retrained)"
    )
    return result if isinstance(result, dict) else None
