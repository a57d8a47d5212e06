"""The sweep: Hydra's ``-m`` as fused trial groups (the plugin shim lives in ``hydra_plugins``).

The job side is the user's own task function, whose ``model`` node the sweeper points at the group's
fused trials (:mod:`~lightning_hydro.sweeper.job.group_task`, :mod:`~lightning_hydro.sweeper.job.group_model`), or
the ready-made :func:`fit_from_config` with :func:`fit_trials` (the one function that trains a group);
everything else here runs in the sweeper: search spaces, samplers, trial groups, the persisted plan,
results and plots.
"""

from lightning_hydro.schedulers import TrialResult
from lightning_hydro.sweeper.job.fit_from_config import apply_overrides, fit_from_config
from lightning_hydro.sweeper.job.fit_trials import TrainerFactory, fit_trials
from lightning_hydro.sweeper.job.metric_history import MetricHistory
from lightning_hydro.sweeper.job.trainer_factory import ConfigTrainerFactory
from lightning_hydro.sweeper.json_files import CorruptStateFile
from lightning_hydro.sweeper.planning.fusion_limit import FusionProbe, fusion_limit_from_probe, measure_fusion_limit

__all__ = [
    "ConfigTrainerFactory",
    "CorruptStateFile",
    "FusionProbe",
    "MetricHistory",
    "TrainerFactory",
    "TrialResult",
    "apply_overrides",
    "fit_from_config",
    "fit_trials",
    "fusion_limit_from_probe",
    "measure_fusion_limit",
]
