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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from lightning_hydro._deprecation import Renamed, renamed_names

if TYPE_CHECKING:
    from lightning_hydro.sweeper.job.fit_from_config import apply_overrides, fit_from_config
    from lightning_hydro.sweeper.job.fit_trials import TrainerFactory, fit_trials
    from lightning_hydro.sweeper.job.metric_history import MetricHistory
    from lightning_hydro.sweeper.job.trainer_factory import ConfigTrainerFactory
    from lightning_hydro.sweeper.json_files import CorruptStateFile
    from lightning_hydro.sweeper.planning.fusion_limit import FusionProbe, fusion_limit_from_probe, measure_fusion_limit

# Imported when first asked for: Hydra imports this package on its way to the sweeper (``sweeper._impl``), and
# the sweeper's process plans a sweep without torch or Lightning; the names below are the job's side and the probe.
_EXPORTS = {
    "ConfigTrainerFactory": "lightning_hydro.sweeper.job.trainer_factory",
    "CorruptStateFile": "lightning_hydro.sweeper.json_files",
    "FusionProbe": "lightning_hydro.sweeper.planning.fusion_limit",
    "MetricHistory": "lightning_hydro.sweeper.job.metric_history",
    "TrainerFactory": "lightning_hydro.sweeper.job.fit_trials",
    "apply_overrides": "lightning_hydro.sweeper.job.fit_from_config",
    "fit_from_config": "lightning_hydro.sweeper.job.fit_from_config",
    "fit_trials": "lightning_hydro.sweeper.job.fit_trials",
    "fusion_limit_from_probe": "lightning_hydro.sweeper.planning.fusion_limit",
    "measure_fusion_limit": "lightning_hydro.sweeper.planning.fusion_limit",
}

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

# The old modules ``fit_from_config`` and ``fit_trials`` (deprecated stubs) share their names with two functions
# above. Importing a submodule binds it as the package's attribute, which would hide the function: the stubs are
# imported now (they import nothing heavy) and their bindings dropped, so that both names resolve through
# ``__getattr__`` to the functions; a later import of a stub finds it in ``sys.modules`` and binds nothing.
for _old_module in ("fit_from_config", "fit_trials"):
    importlib.import_module(f"{__name__}.{_old_module}")
    del globals()[_old_module]

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
    lazy=_EXPORTS,
)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
