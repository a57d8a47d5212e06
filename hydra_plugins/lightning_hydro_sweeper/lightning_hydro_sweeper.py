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
    :class:`~hydra_plugins.lightning_hydro_sweeper.config.LightningHydroSweeperConf`.
    """

    def __init__(
        self,
        sampler: str,
        n_trials: int | None,
        seed: int,
        metric: str,
        mode: str,
        non_fusible: list[str],
        fusion_limit: Any,
        round_size: int | None,
        params: DictConfig | None,
        scheduler: DictConfig,
        probe: DictConfig,
        retrain: DictConfig,
        compile: Any = False,
        storage: str | None = None,
        plots: bool = True,
        pad_widths: bool = True,
        max_padding_overhead: float = 1.0,
        devices_per_group: int | None = None,
        groups_per_device: int = 1,
    ) -> None:
        from lightning_hydro.sweeper._impl import LightningHydroSweeperImpl

        self.sweeper = LightningHydroSweeperImpl(
            sampler=sampler,
            n_trials=n_trials,
            seed=seed,
            metric=metric,
            mode=mode,
            non_fusible=non_fusible,
            fusion_limit=fusion_limit,
            round_size=round_size,
            params=params,
            scheduler=scheduler,
            probe=probe,
            retrain=retrain,
            compile=compile,
            storage=storage,
            plots=plots,
            pad_widths=pad_widths,
            max_padding_overhead=max_padding_overhead,
            devices_per_group=devices_per_group,
            groups_per_device=groups_per_device,
        )

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Create the launcher; called by Hydra before :meth:`sweep`."""
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        """Run the sweep over ``hydra.sweeper.params`` plus the command line ``arguments``."""
        return self.sweeper.sweep(arguments)
