"""``Hyperband``: successive-halving brackets from many short trials to few long ones, each judged by ASHA."""

from __future__ import annotations

from typing import Any

import lightning as L
from typing_extensions import override

from lightning_hydro.callbacks.callback_arguments import hydra_job_number
from lightning_hydro.callbacks.halving_callback import HalvingCallback
from lightning_hydro.callbacks.refill_source import RefillSpec
from lightning_hydro.callbacks.trials_view import TrialsView
from lightning_hydro.stopping import HalvingConfig, HyperbandRule, Mode, RungStore, StoreSpec, TimeAttr, TrialId
from lightning_hydro.stopping.hyperband import BracketOrder

__all__ = ["Hyperband"]


class Hyperband(HalvingCallback):
    """Hyperband (Li et al., JMLR 2018) with asynchronous brackets.

    With ``R = max_t / grace_period``, there are ``s_max + 1 = floor(log_eta R) + 1`` brackets; bracket ``s``
    first judges its trials at ``grace_period * eta**(s_max - s)``, so ``s = s_max`` is plain successive halving
    from the grace period and ``s = 0`` trains every trial to the top rung. Each trial joins a bracket when it
    enters its slot (``order="sequential"``: the paper's order, the first ``n_{s_max}`` trials to ``s_max`` and so
    on; ``"interleaved"``: brackets mixed in proportion to their sizes) and is judged there by ASHA's rule.
    Hyperband hedges against a grace period too short for the slow starters that end up best.

    Takes every argument of :class:`~lightning_hydro.callbacks.halving_callback.HalvingCallback`, and:

    Args:
        order: ``"sequential"`` or ``"interleaved"`` (see
            :func:`~lightning_hydro.stopping.hyperband.bracket_for_position`).
        position: One trial per process: this trial's place in the sweep (e.g. its Hydra job number, the default
            under a multirun), which decides its bracket. An integer ``trial_id`` is used when this is not given.

    Raises:
        ValueError: As :class:`~lightning_hydro.callbacks.asha.ASHA`, for an unknown ``order``, and when fit starts
            with one trial per process and no position.

    Example::

        >>> import lightning as L
        >>> from lightning_hydro import FusedLightningModule
        >>> from lightning_hydro.demos import DigitsDataModule, DigitsMLP
        >>> trials = [DigitsMLP(hidden_dim=16, lr=0.02 * (i + 1)) for i in range(6)]
        >>> hyperband = Hyperband(monitor="val_acc", mode="max", grace_period=1, reduction_factor=3, max_t=3)
        >>> trainer = L.Trainer(max_epochs=3, callbacks=[hyperband], logger=False, enable_progress_bar=False,
        ...                     enable_checkpointing=False, enable_model_summary=False, limit_train_batches=4)
        >>> fused = FusedLightningModule(trials, backend="vmap", summary=False)
        >>> trainer.fit(fused, datamodule=DigitsDataModule())
        >>> [bracket.trials for bracket in hyperband.rule.brackets]   # bracket s=1 starts 3 trials, s=0 starts 2
        [3, 2]
        >>> hyperband.rule.assignments                                # trial id -> bracket, in the paper's order
        {0: 1, 1: 1, 2: 1, 3: 0, 4: 0, 5: 1}
    """

    def __init__(
        self,
        monitor: str,
        mode: Mode = "min",
        *,
        grace_period: int = 1,
        reduction_factor: int = 3,
        max_t: int | None = None,
        time_attr: TimeAttr = "epochs",
        order: BracketOrder = "sequential",
        refill: RefillSpec | None = None,
        storage: StoreSpec = None,
        namespace: str = "default",
        trial_id: TrialId | None = None,
        position: int | None = None,
        verbose: bool = False,
    ) -> None:
        super().__init__(
            monitor,
            mode,
            grace_period=grace_period,
            reduction_factor=reduction_factor,
            max_t=max_t,
            time_attr=time_attr,
            refill=refill,
            storage=storage,
            namespace=namespace,
            trial_id=trial_id,
            verbose=verbose,
        )
        if order not in ("sequential", "interleaved"):
            raise ValueError(
                f"Hyperband: order must be 'sequential' or 'interleaved', got {order!r}. 'sequential' fills brackets "
                "in the paper's order; 'interleaved' mixes them within every group of trials."
            )
        if position is not None and (isinstance(position, bool) or not isinstance(position, int) or position < 0):
            raise ValueError(
                f"Hyperband: position must be an integer >= 0 (the trial's place in the sweep), got {position!r}."
            )
        self.order: BracketOrder = order
        self.position = position

    @override
    def _check_trials(self, view: TrialsView, pl_module: L.LightningModule) -> None:
        super()._check_trials(view, pl_module)
        if not view.together and self._position() is None:
            raise ValueError(
                "Hyperband: with one trial per process, each process needs its place in the sweep to choose the "
                "trial's bracket; pass position=<job number> (or an integer trial_id), or run under a Hydra multirun, "
                "whose job number is used."
            )

    def _position(self) -> int | None:
        if self.position is not None:
            return self.position
        if isinstance(self.trial_id, int) and not isinstance(self.trial_id, bool):
            return self.trial_id
        return hydra_job_number()

    @override
    def _build_rule(self, config: HalvingConfig, store: RungStore | None) -> Any:
        return HyperbandRule(config, store, order=self.order)

    @override
    def _on_trial_started(self, key: TrialId) -> None:
        self.rule.add_trial(key, position=None if self._trials.together else self._position())

    @override
    def _bracket_of(self, key: TrialId) -> int | None:
        return self.rule.assignments.get(key)

    @override
    def _settings(self) -> dict[str, Any]:
        return {**super()._settings(), "order": self.order}
