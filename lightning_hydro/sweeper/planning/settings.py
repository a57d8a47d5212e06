"""Validated sweeper settings: ``hydra.sweeper.*`` checked once, before any job starts.

Every error names the setting, what was expected, what came, and how to fix it. Every default is written once, in
the Hydra config node (:class:`~hydra_plugins.lightning_hydro_sweeper.config.LightningHydroSweeperConf` and its
sections, which Hydra's plugin discovery imports without torch): :meth:`SweepSettings.from_config` fills what it is
not given from there, and the plugin's Sweeper passes the node's fields on as they are.

Example::

    >>> settings = SweepSettings.from_config(sampler="random", n_trials=8, fusion_limit="auto")
    >>> settings.fusion_limit, settings.scheduler.name
    ('auto', 'none')
    >>> SweepSettings.from_config(sampler="bayes", n_trials=8)
    Traceback (most recent call last):
    ...
    ValueError: lightning_hydro sweeper: unknown sampler 'bayes'; expected one of ['grid', 'random', ...
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from hydra_plugins.lightning_hydro_sweeper.config import (
    FusionProbeConf,
    LightningHydroSweeperConf,
    RetrainConf,
    SchedulerConf,
)
from lightning_hydro._deprecation import removal_version
from lightning_hydro.sweeper.app_config import config_section
from lightning_hydro.sweeper.planning.samplers import SAMPLERS
from lightning_hydro.sweeper.planning.study_channel import is_learning_sampler

__all__ = ["SCHEDULERS", "ProbeSettings", "RetrainSettings", "SchedulerSettings", "SweepSettings"]

SCHEDULERS = ("none", "asha", "successive_halving", "hyperband", "deadline")
# Old names of hydra.sweeper.scheduler settings, accepted for one release with a DeprecationWarning.
_RENAMED_SETTINGS = {"min_budget": "grace_period", "max_budget": "max_t"}
_RENAMED_SCHEDULERS = {"hypersched": "deadline"}
_P = "lightning_hydro sweeper"


@dataclass(frozen=True)
class SchedulerSettings:
    """``hydra.sweeper.scheduler``: early stopping inside each group (named as the callbacks name it)."""

    name: str
    reduction_factor: float
    grace_period: int
    max_t: int | None
    refill: bool
    options: dict[str, Any]


@dataclass(frozen=True)
class ProbeSettings:
    """``hydra.sweeper.probe``: how ``fusion_limit: auto`` turns a probe into a limit."""

    safety_margin: float
    max_limit: int


@dataclass(frozen=True)
class RetrainSettings:
    """``hydra.sweeper.retrain``: final full-scale jobs for the best configurations."""

    top_k: int
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class SweepSettings:
    """All of ``hydra.sweeper``, validated (see ``LightningHydroSweeperConf`` for each field)."""

    sampler: str
    n_trials: int | None
    seed: int
    metric: str
    mode: Literal["min", "max"]
    non_fusible: tuple[str, ...]
    fusion_limit: int | Literal["auto"]
    round_size: int | None
    params: tuple[str, ...]
    scheduler: SchedulerSettings
    probe: ProbeSettings
    retrain: RetrainSettings
    compile: bool | Literal["reduce-overhead"]
    storage: str | None
    plots: bool
    pad_widths: bool
    max_padding_overhead: float
    devices_per_group: int | None
    groups_per_device: int

    @property
    def continuous(self) -> bool:
        """Whether freed slots ask the sweep's (learning) sampler for new configurations as results arrive."""
        return is_learning_sampler(self.sampler) and self.scheduler.name in ("asha", "hyperband", "deadline")

    @classmethod
    def from_config(cls, **given: Any) -> SweepSettings:
        """Validate the fields of ``hydra.sweeper`` (plain values, dicts or DictConfigs).

        Args:
            given: any fields of :class:`~hydra_plugins.lightning_hydro_sweeper.config.LightningHydroSweeperConf`
                (its ``_target_`` aside); the others take the defaults written there.

        Raises:
            TypeError: for a field that ``hydra.sweeper`` does not have.
            ValueError: naming the first invalid setting and how to fix it.
        """
        defaults = _defaults(LightningHydroSweeperConf())
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise TypeError(
                f"SweepSettings.from_config() got unexpected keyword argument(s) {unknown}; hydra.sweeper has "
                f"{sorted(defaults)}."
            )
        values = {**defaults, **given}
        sampler: str = values["sampler"]
        n_trials: int | None = values["n_trials"]
        seed: int = values["seed"]
        metric: str = values["metric"]
        mode: str = values["mode"]
        non_fusible: Sequence[str] = values["non_fusible"]
        fusion_limit: Any = values["fusion_limit"]
        round_size: int | None = values["round_size"]
        params: Mapping[str, Any] | None = values["params"]
        compile: Any = values["compile"]
        storage: str | None = values["storage"]
        plots: bool = values["plots"]
        pad_widths: bool = values["pad_widths"]
        max_padding_overhead: float = values["max_padding_overhead"]
        devices_per_group: int | None = values["devices_per_group"]
        groups_per_device: int = values["groups_per_device"]
        if sampler not in SAMPLERS and not is_learning_sampler(sampler):
            raise ValueError(
                f"{_P}: unknown sampler {sampler!r}; expected one of {list(SAMPLERS)}. Fix: e.g. "
                "hydra.sweeper.sampler=random, or an Optuna sampler's import path (e.g. "
                "optuna.samplers.CmaEsSampler)."
            )
        if n_trials is not None and n_trials < 1:
            raise ValueError(f"{_P}: hydra.sweeper.n_trials must be >= 1, got {n_trials}.")
        if n_trials is None and sampler != "grid":
            raise ValueError(
                f"{_P}: sampler {sampler!r} needs hydra.sweeper.n_trials (how many configurations to try), "
                "got null. Fix: e.g. hydra.sweeper.n_trials=32."
            )
        if mode not in ("min", "max"):
            raise ValueError(f"{_P}: hydra.sweeper.mode must be 'min' or 'max', got {mode!r}.")
        if not (compile is False or compile is True or compile == "reduce-overhead"):
            raise ValueError(
                f"{_P}: hydra.sweeper.compile must be false, true or reduce-overhead, got {compile!r}. Fix: e.g. "
                "hydra.sweeper.compile=true (each group's training step under torch.compile)."
            )
        if storage is not None and (not isinstance(storage, str) or "://" not in storage):
            raise ValueError(
                f"{_P}: hydra.sweeper.storage must be a database URL shared by every job of the sweep, got "
                f"{storage!r}. Fix: e.g. hydra.sweeper.storage=postgresql://user:password@host/sweeps, or null "
                "for files in the sweep directory (jobs on one machine or a shared file system)."
            )
        if not isinstance(plots, bool):
            raise ValueError(f"{_P}: hydra.sweeper.plots must be true or false, got {plots!r}.")
        if not isinstance(pad_widths, bool):
            raise ValueError(f"{_P}: hydra.sweeper.pad_widths must be true or false, got {pad_widths!r}.")
        if not isinstance(max_padding_overhead, int | float) or max_padding_overhead < 0:
            raise ValueError(
                f"{_P}: hydra.sweeper.max_padding_overhead must be a number >= 0 (padded cost over own cost, "
                f"minus 1), got {max_padding_overhead!r}. Fix: e.g. hydra.sweeper.max_padding_overhead=1.0 "
                "(a group may cost up to twice its trials at their own widths), or 0 to fuse only equal widths."
            )
        for name, value, nullable in (
            ("devices_per_group", devices_per_group, True),
            ("groups_per_device", groups_per_device, False),
        ):
            if (value is None and not nullable) or (
                value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1)
            ):
                raise ValueError(
                    f"{_P}: hydra.sweeper.{name} must be an integer >= 1{' or null' if nullable else ''}, got "
                    f"{value!r}. Fix: e.g. hydra.sweeper.devices_per_group=1 hydra.sweeper.groups_per_device=1 (one "
                    "group job per GPU at a time)."
                )
        if round_size is not None and round_size < 1:
            raise ValueError(f"{_P}: hydra.sweeper.round_size must be >= 1 or null, got {round_size}.")
        return cls(
            sampler=sampler,
            n_trials=n_trials,
            seed=int(seed),
            metric=metric,
            mode=mode,  # type: ignore[arg-type]  # checked above
            non_fusible=tuple(str(k) for k in non_fusible),
            fusion_limit=_fusion_limit(fusion_limit),
            round_size=round_size,
            params=_param_lines(params),
            scheduler=_scheduler(_section(given, "scheduler")),
            probe=_probe(_section(given, "probe")),
            retrain=_retrain(_section(given, "retrain")),
            compile=compile,
            storage=storage,
            plots=plots,
            pad_widths=pad_widths,
            max_padding_overhead=float(max_padding_overhead),
            devices_per_group=devices_per_group,
            groups_per_device=groups_per_device,
        )

    def request(self, search_space: Sequence[str]) -> dict[str, Any]:
        """What defines the sweep for a resume: all but ``metric``, ``mode``, ``retrain``, ``plots`` and devices.

        Those only rank, retrain and draw finished trials, or place the jobs, so a resume may change them.
        """
        return {
            "sampler": self.sampler,
            "n_trials": self.n_trials,
            "seed": self.seed,
            "non_fusible": list(self.non_fusible),
            "fusion_limit": self.fusion_limit,
            "round_size": self.round_size,
            "scheduler": asdict(self.scheduler),
            "search_space": list(search_space),
            **({"pad_widths": False} if not self.pad_widths else {}),
            **({"max_padding_overhead": self.max_padding_overhead} if self.max_padding_overhead != 1.0 else {}),
            **({"storage": self.storage} if self.storage is not None else {}),
        }


def _defaults(conf: Any) -> dict[str, Any]:
    """The defaults of ``hydra.sweeper`` or of one of its sections, as the Hydra config node writes them.

    A fresh instance each time (its lists and dicts are not shared); ``_target_`` is Hydra's, not a setting. A
    section given in part keeps the other defaults of that section.
    """
    return {f.name: getattr(conf, f.name) for f in fields(conf) if f.name != "_target_"}


def _section(given: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The section ``hydra.sweeper.<name>`` as given (the defaults of its fields not given are added by the caller)."""
    return config_section(given.get(name), what=f"{_P}: hydra.sweeper.{name}")


def _fusion_limit(value: Any) -> int | Literal["auto"]:
    if value == "auto":
        return "auto"
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{_P}: hydra.sweeper.fusion_limit must be an integer >= 1 or 'auto', got {value!r}. Fix: e.g. "
            "hydra.sweeper.fusion_limit=16."
        )
    if value < 1:
        raise ValueError(
            f"{_P}: hydra.sweeper.fusion_limit must be >= 1 (trials fused in one group), got {value}. Fix: "
            "e.g. hydra.sweeper.fusion_limit=16, or 'auto' to measure it."
        )
    return value


def _param_lines(params: Mapping[str, Any] | None) -> tuple[str, ...]:
    """``key=value`` lines; nested mappings give dotted keys, and a ``null`` value drops its key."""
    lines = []
    for key, value in _flatten(config_section(params, what=f"{_P}: hydra.sweeper.params"), "").items():
        if isinstance(value, list):
            raise ValueError(
                f"{_P}: hydra.sweeper.params.{key} must be an override string in Hydra's grammar, got "
                f"{value!r}. Fix: e.g. '{key}: choice(32, 64)' or '{key}: tag(log, interval(1e-4, 1))'."
            )
        if value is not None:
            lines.append(f"{key}={value}")
    return tuple(lines)


def _flatten(tree: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out.pop(f"{prefix}{key}", None)  # a later entry for the same key wins
            out[f"{prefix}{key}"] = value
    return out


def _scheduler(given: dict[str, Any]) -> SchedulerSettings:
    defaults = {k: v for k, v in _defaults(SchedulerConf()).items() if k not in _RENAMED_SETTINGS}
    raw = {**defaults, **given}
    for old, new in _RENAMED_SETTINGS.items():
        value = raw.pop(old, None)
        if value is None:
            continue
        warnings.warn(
            f"{_P}: hydra.sweeper.scheduler.{old} is renamed {new} (the callbacks' name); use "
            f"hydra.sweeper.scheduler.{new}={value}. The old name will be removed in "
            f"{removal_version()}.",
            DeprecationWarning,
            stacklevel=2,
        )
        default = defaults[new]
        if raw.get(new, default) not in (default, value):
            raise ValueError(
                f"{_P}: hydra.sweeper.scheduler.{old}={value} and {new}={raw[new]} disagree; {old} is the old name "
                f"of {new}. Fix: set only hydra.sweeper.scheduler.{new}."
            )
        raw[new] = value
    name = raw.get("name")
    if name in _RENAMED_SCHEDULERS:
        raw["name"] = _RENAMED_SCHEDULERS[name]
        warnings.warn(
            f"{_P}: hydra.sweeper.scheduler.name={name} is renamed {raw['name']} (the Deadline callback); use "
            f"hydra.sweeper.scheduler.name={raw['name']}. The old name will be removed in "
            f"{removal_version()}.",
            DeprecationWarning,
            stacklevel=2,
        )
    settings = SchedulerSettings(**raw)
    if settings.name not in SCHEDULERS:
        raise ValueError(
            f"{_P}: unknown scheduler {settings.name!r}; expected one of {list(SCHEDULERS)}. Fix: e.g. "
            "hydra.sweeper.scheduler.name=asha, or none for no early stopping."
        )
    if not settings.reduction_factor > 1:
        raise ValueError(
            f"{_P}: hydra.sweeper.scheduler.reduction_factor must be > 1 (each rung keeps 1/reduction_factor "
            f"of its trials), got {settings.reduction_factor}. Fix: e.g. "
            "hydra.sweeper.scheduler.reduction_factor=3."
        )
    if settings.grace_period < 1:
        raise ValueError(
            f"{_P}: hydra.sweeper.scheduler.grace_period must be >= 1 epoch, got {settings.grace_period}. Fix: e.g. "
            "hydra.sweeper.scheduler.grace_period=1."
        )
    if settings.max_t is not None and settings.max_t < settings.grace_period:
        raise ValueError(
            f"{_P}: hydra.sweeper.scheduler.max_t ({settings.max_t}) must be >= grace_period "
            f"({settings.grace_period}), or null to use trainer.max_epochs."
        )
    return settings


def _probe(given: dict[str, Any]) -> ProbeSettings:
    settings = ProbeSettings(**{**_defaults(FusionProbeConf()), **given})
    if not 0.0 <= settings.safety_margin < 1.0:
        raise ValueError(f"{_P}: hydra.sweeper.probe.safety_margin must be in [0, 1), got {settings.safety_margin}.")
    if settings.max_limit < 1:
        raise ValueError(f"{_P}: hydra.sweeper.probe.max_limit must be >= 1, got {settings.max_limit}.")
    return settings


def _retrain(given: dict[str, Any]) -> RetrainSettings:
    raw = {**_defaults(RetrainConf()), **given}
    settings = RetrainSettings(top_k=int(raw["top_k"]), overrides=tuple(raw["overrides"]))
    if settings.top_k < 0:
        raise ValueError(f"{_P}: hydra.sweeper.retrain.top_k must be >= 0, got {settings.top_k}.")
    return settings
