"""The sweep: Hydra's ``-m`` as fused trial groups (the plugin shim lives in ``hydra_plugins``).

Two sides, and the contract between them:

- :mod:`~lightning_hydro.sweeper.planning`: what runs in the sweeper's process: search spaces, samplers, the
  trial groups (:mod:`~lightning_hydro.sweeper.planning.grouping` is the entry), the persisted plan, results
  and plots; the sweeper class itself is :class:`~lightning_hydro.sweeper._impl.LightningHydroSweeperImpl`;
- :mod:`~lightning_hydro.sweeper.job`: what runs inside a launched group job: the user's own task function,
  whose ``model`` node the sweeper points at the group's fused trials (:mod:`~lightning_hydro.sweeper.job.group_task`,
  :mod:`~lightning_hydro.sweeper.job.group_model`), or the ready-made :func:`fit_from_config` with :func:`fit_trials`
  (the one function that trains a group);
- :mod:`~lightning_hydro.sweeper.group_spec`: the contract, what the sweeper tells a job and where the job answers.
"""

import importlib

from lightning_hydro._deprecation import Renamed, renamed_names
from lightning_hydro.sweeper.job.fit_from_config import apply_overrides
from lightning_hydro.sweeper.job.fit_trials import TrainerFactory
from lightning_hydro.sweeper.job.metric_history import MetricHistory
from lightning_hydro.sweeper.job.trainer_factory import ConfigTrainerFactory
from lightning_hydro.sweeper.json_files import CorruptStateFile
from lightning_hydro.sweeper.planning.fusion_limit import FusionProbe, fusion_limit_from_probe, measure_fusion_limit

# The old modules of the same names (deprecated stubs) are loaded first: importing a submodule binds it as the
# package's attribute, which would otherwise hide the functions ``fit_from_config`` and ``fit_trials`` below.
for _old_module in ("fit_from_config", "fit_trials"):
    importlib.import_module(f"{__name__}.{_old_module}")
from lightning_hydro.sweeper.job.fit_from_config import fit_from_config  # noqa: E402  (after the stub, see above)
from lightning_hydro.sweeper.job.fit_trials import fit_trials  # noqa: E402

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
