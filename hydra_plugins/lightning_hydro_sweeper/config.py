"""Config of the ``lightning_hydro`` sweeper, registered as ``hydra/sweeper=lightning_hydro``.

Hydra imports this module at every application start (plugin discovery), so it imports nothing but
Hydra and the standard library. This is where every default of ``hydra.sweeper`` is written, once: the Sweeper
passes the fields on as they come, and ``lightning_hydro.sweeper.planning.settings`` reads its defaults from here
when it validates them, as the sweep starts and before any job is launched.
"""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class SchedulerConf:
    """Early stopping inside each trial group (``hydra.sweeper.scheduler``).

    The names are those of the callbacks in ``lightning_hydro.callbacks`` (``grace_period``, ``max_t``,
    ``Deadline``).

    Attributes:
        name: ``none``, ``asha``, ``successive_halving``, ``hyperband`` or ``deadline`` (HyperSched).
        reduction_factor: keep the best 1/reduction_factor of trials at each rung (> 1).
        grace_period: epochs a trial trains before its first stop decision (>= 1).
        max_t: epochs at the top rung; ``null`` takes the app's ``trainer.max_epochs``.
        refill: start pending trials of the same partition in slots that stopped trials free
            (each partition then runs as one job); ``false`` splits partitions into groups of at most
            the fusion limit, one job each.
        options: further keyword arguments of the callback (e.g. ``deadline`` in seconds for ``deadline``).
        min_budget: deprecated name of ``grace_period`` (a DeprecationWarning; removed in 0.3.0).
        max_budget: deprecated name of ``max_t`` (a DeprecationWarning; removed in 0.3.0).
    """

    name: str = "none"
    reduction_factor: float = 3.0
    grace_period: int = 1
    max_t: int | None = None
    refill: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    min_budget: int | None = None
    max_budget: int | None = None


@dataclass
class FusionProbeConf:
    """How ``fusion_limit: auto`` turns a probe at B=1 and B=2 into a limit (``hydra.sweeper.probe``).

    Attributes:
        safety_margin: share of the device memory left free (0 <= margin < 1).
        max_limit: never fuse more trials than this, whatever the memory allows.
    """

    safety_margin: float = 0.2
    max_limit: int = 64


@dataclass
class RetrainConf:
    """Final jobs that retrain the best configurations at full scale (``hydra.sweeper.retrain``).

    Attributes:
        top_k: number of best trials to retrain after the search (0: none).
        overrides: extra overrides of the retrain jobs, e.g. ``[trainer.max_epochs=100]`` or a wider
            ``model.hidden_dim`` (the full-size target of a muP surrogate).
    """

    top_k: int = 0
    overrides: list[str] = field(default_factory=list)


@dataclass
class LightningHydroSweeperConf:
    """``hydra/sweeper=lightning_hydro``: a search run as fused trial groups, one Hydra job per group.

    Attributes:
        sampler: ``grid``, ``random`` (seeded), ``tpe`` (Optuna's TPE, needs the ``optuna`` extra) or the import
            path of any Optuna sampler class (e.g. ``optuna.samplers.CmaEsSampler``). ``tpe`` and Optuna
            samplers learn continuously with a refilling scheduler (asha, hyperband, deadline): every rung
            value is reported to them as it is recorded, and a freed slot asks them for a new configuration.
        n_trials: configurations to try; required by ``random`` and ``tpe``, optional bound for ``grid``.
        seed: seed of the sampler.
        metric: name of the logged metric that ranks trials (e.g. ``val_acc``), as the module logs it; each
            trial's own value is read, not what the task function returns.
        mode: ``min`` or ``max``: whether a lower or a higher ``metric`` is better.
        non_fusible: config keys whose value must be the same for all trials of a group (anything
            that changes shapes or the data pipeline, e.g. ``data.batch_size``, ``model.hidden_dim``).
        fusion_limit: most trials trained at once in one group: a number >= 1, or ``auto`` to probe.
        round_size: configurations asked of the sampler at a time; ``null``: all of them for ``grid``
            and ``random``, the fusion limit for ``tpe`` (which learns from each finished round; with a
            refilling scheduler only the first round: the groups ask for the rest as their slots free).
        params: the search space, ``key: override value`` in Hydra's override grammar (nested keys
            give dotted ones, so ``hydra.sweeper.params.model.lr=...`` works on the command line; a
            ``null`` value drops a key).
        scheduler: early stopping inside each group.
        probe: settings of ``fusion_limit: auto``.
        retrain: final retraining of the best configurations.
        compile: ``false``, ``true`` or ``reduce-overhead``: each group's fused training step under
            ``torch.compile`` (``FusedLightningModule(compile=...)``; an app config's ``fused.compile`` wins).
        storage: a database URL (e.g. ``postgresql://user:password@host/db``) holding the sweep's rung
            records and sampler state, for group jobs on several machines; ``null``: files in the sweep
            directory (``lightning_hydro/rungs.db``, ``lightning_hydro/sampler.journal``).
        plots: draw ``plots/`` at the end of the sweep (in a background process, which does not delay it).
        pad_widths: non-fusible keys under ``model.`` with integer values (hidden widths) no longer split
            groups: trials that differ only in them fuse, zero-padded to their group's largest width, and the
            keys padded and each group's padding overhead are logged at launch.
        max_padding_overhead: the most a padded group may cost over its trials at their own widths, minus 1
            (1.0: up to twice; 0: only equal widths fuse).
        devices_per_group: GPUs each group job gets where the jobs run on the sweep's machine (basic, joblib,
            submitit_local launchers): blocks of this many GPUs are dealt to the jobs round-robin and set as
            their ``trainer.devices``. ``null``: with a parallel launcher, the Trainer's ``devices`` if it is a
            number (``auto``/``-1``: one GPU each); with the basic launcher, no assignment. On SLURM and Ray the
            cluster places GPUs (``hydra.launcher.gpus_per_node``, ``hydra.launcher.ray.remote.num_gpus``).
        groups_per_device: group jobs that may share one block of GPUs at once; the sweeper launches at most
            (blocks x this) jobs at a time, and ``fusion_limit: auto`` sizes each group for its share of the
            memory (and no more than is free).
    """

    _target_: str = "hydra_plugins.lightning_hydro_sweeper.lightning_hydro_sweeper.LightningHydroSweeper"
    sampler: str = "random"
    n_trials: int | None = None
    seed: int = 0
    metric: str = "val_loss"
    mode: str = "min"
    non_fusible: list[str] = field(default_factory=list)
    fusion_limit: Any = 16
    round_size: int | None = None
    params: dict[str, Any] | None = None
    scheduler: SchedulerConf = field(default_factory=SchedulerConf)
    probe: FusionProbeConf = field(default_factory=FusionProbeConf)
    retrain: RetrainConf = field(default_factory=RetrainConf)
    compile: Any = False
    storage: str | None = None
    plots: bool = True
    pad_widths: bool = True
    max_padding_overhead: float = 1.0
    devices_per_group: int | None = None
    groups_per_device: int = 1


ConfigStore.instance().store(
    group="hydra/sweeper",
    name="lightning_hydro",
    node=LightningHydroSweeperConf,
    provider="lightning_hydro",
)
