"""The sweep: Hydra's ``-m`` as fused trial groups (the plugin shim lives in ``hydra_plugins``).

The job side is the user's own task function, whose ``model`` node the sweeper points at the group's
fused trials (:mod:`~lightning_hydro.sweeper.group_task`, :mod:`~lightning_hydro.sweeper.group_model`), or
the ready-made :func:`fit_from_config` with :func:`fit_trials` (the one function that trains a group);
everything else here runs in the sweeper: search spaces, samplers, trial groups, the persisted plan,
results and plots.
"""

from lightning_hydro._deprecation import Renamed, renamed_names
from lightning_hydro.sweeper.fit_from_config import apply_overrides, fit_from_config
from lightning_hydro.sweeper.fit_trials import TrainerFactory, fit_trials
from lightning_hydro.sweeper.fusion_limit import FusionProbe, fusion_limit_from_probe, measure_fusion_limit
from lightning_hydro.sweeper.json_files import CorruptStateFile
from lightning_hydro.sweeper.metric_history import MetricHistory
from lightning_hydro.sweeper.trainer_factory import ConfigTrainerFactory

__all__ = [
    "ConfigTrainerFactory",
    "CorruptStateFile",
    "FusionProbe",
    "MetricHistory",
    "TrainerFactory",
    "apply_overrides",
    "fit_from_config",
    "fit_trials",
    "fusion_limit_from_probe",
    "measure_fusion_limit",
]

# Exported from lightning_hydro.stopping now (each public name from one package), kept here for one release.
__getattr__ = renamed_names(
    __name__,
    {
        "TrialResult": Renamed(
            "lightning_hydro.stopping:TrialResult",
            "is exported from lightning_hydro.stopping (each public name from one package); "
            "import lightning_hydro.stopping.TrialResult instead",
        )
    },
)
