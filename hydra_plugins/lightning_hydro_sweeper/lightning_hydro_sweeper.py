"""The public ``lightning_hydro`` Sweeper: a thin class that Hydra discovers cheaply.

The work happens in ``lightning_hydro.sweeper._impl``, imported only when Hydra instantiates the sweeper
(``-m`` with ``hydra/sweeper=lightning_hydro``), so ordinary runs of any Hydra app pay nothing for it.
"""

from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class LightningHydroSweeper(Sweeper):
    """Runs a hyperparameter search as fused trial groups, one job of the configured launcher each.

    Select it with ``hydra/sweeper=lightning_hydro`` (or ``override hydra/sweeper: lightning_hydro`` in
    the defaults list); every argument is a field of
    :class:`~hydra_plugins.lightning_hydro_sweeper.config.LightningHydroSweeperConf`, where its default is written.
    """

    def __init__(self, **settings: Any) -> None:
        # The fields of the config node, passed on as they come: their defaults are written once, in
        # LightningHydroSweeperConf, and checked by lightning_hydro.sweeper.planning.settings when the sweep starts.
        from lightning_hydro.sweeper._impl import LightningHydroSweeperImpl

        self.sweeper = LightningHydroSweeperImpl(**settings)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Create the launcher; called by Hydra before :meth:`sweep`."""
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        """Run the sweep over ``hydra.sweeper.params`` plus the command line ``arguments``."""
        return self.sweeper.sweep(arguments)
