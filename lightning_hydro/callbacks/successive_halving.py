"""``SuccessiveHalving``: synchronous successive halving of a fused group of trials that start together."""

from __future__ import annotations

from typing import Any

import lightning as L
from typing_extensions import override

from lightning_hydro.callbacks.halving_callback import HalvingCallback
from lightning_hydro.callbacks.trials_view import TrialsView
from lightning_hydro.stopping import (
    Decision,
    HalvingConfig,
    Mode,
    RungStore,
    SuccessiveHalvingRule,
    TimeAttr,
    TrialReport,
)
from lightning_hydro.stopping.halving_config import Rounding

__all__ = ["SuccessiveHalving"]


class SuccessiveHalving(HalvingCallback):
    """Synchronous successive halving (Jamieson and Talwalkar, 2016) of the trials of a FusedLightningModule.

    The trials of the group train in lockstep. At each rung milestone (``grace_period * reduction_factor**k``
    epochs or steps, up to ``max_t``) the best ``ceil(n / reduction_factor)`` of the ``n`` trials still running go
    on (``rounding="floor"``: ``max(1, floor(n / reduction_factor))``, the Hyperband paper's rounding); the others
    leave their slots through ``stop_trial``, so the group shrinks and each step costs less. Trials reaching
    ``max_t`` are stopped as ``completed``. For 27 trials, ``reduction_factor=3``, ``grace_period=1`` and
    ``max_t=9`` this spends 27 + 9 * 2 + 3 * 6 = 63 of the 243 trial-epochs of training all 27 to the end.

    Synchronous halving needs a cohort that starts together, so it does not take ``refill`` or ``storage``: use
    :class:`~lightning_hydro.callbacks.asha.ASHA` for those (on a group that starts together it cuts the same
    trials).

    Args:
        monitor: The metric that ranks trials (e.g. ``"val_loss"``).
        mode: ``"min"`` or ``"max"``: which values of ``monitor`` are better.
        grace_period: Budget before the first rung.
        reduction_factor: ``eta``.
        max_t: Budget at which a trial is complete (default: the Trainer's ``max_epochs`` or ``max_steps``).
        time_attr: ``"epochs"`` or ``"steps"``.
        rounding: ``"ceil"`` (default) or ``"floor"``.
        verbose: Log every decision.

    Raises:
        ValueError: For invalid settings (see :class:`~lightning_hydro.callbacks.asha.ASHA`), and when fit starts
            with an ordinary LightningModule.

    Example::

        >>> import lightning as L
        >>> from lightning_hydro import FusedLightningModule
        >>> from lightning_hydro.demos import DigitsDataModule, DigitsMLP
        >>> trials = [DigitsMLP(hidden_dim=16, lr=0.02 * (i + 1)) for i in range(9)]
        >>> halving = SuccessiveHalving(monitor="val_loss", mode="min", grace_period=1, reduction_factor=3, max_t=3)
        >>> trainer = L.Trainer(max_epochs=3, callbacks=[halving], logger=False, enable_progress_bar=False,
        ...                     enable_checkpointing=False, enable_model_summary=False, limit_train_batches=4)
        >>> fused = FusedLightningModule(trials, backend="vmap", summary=False)
        >>> trainer.fit(fused, datamodule=DigitsDataModule())
        >>> sorted(r["status"] for r in fused.results.values())   # 9 trials: the best 3 go on to max_t
        ['completed', 'completed', 'completed', 'stopped', 'stopped', 'stopped', 'stopped', 'stopped', 'stopped']
        >>> halving.budget.spent, halving.budget.exhaustive       # 9 * 1 + 3 * 2 trial-epochs, of 9 * 3
        (15, 27)
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
        rounding: Rounding = "ceil",
        verbose: bool = False,
    ) -> None:
        super().__init__(
            monitor,
            mode,
            grace_period=grace_period,
            reduction_factor=reduction_factor,
            max_t=max_t,
            time_attr=time_attr,
            verbose=verbose,
        )
        if rounding not in ("ceil", "floor"):
            raise ValueError(
                f"SuccessiveHalving: rounding must be 'ceil' or 'floor', got {rounding!r}. 'ceil' keeps "
                "ceil(n / reduction_factor) trials at each rung (as ASHA does); 'floor' the Hyperband paper's count."
            )
        self.rounding: Rounding = rounding

    @override
    def _check_trials(self, view: TrialsView, pl_module: L.LightningModule) -> None:
        if not view.together:
            raise ValueError(
                f"SuccessiveHalving needs a FusedLightningModule (a group of trials that train together), got a "
                f"{type(pl_module).__name__}. For one trial per process use ASHA(..., storage='asha.db'): the "
                "processes then share rung records."
            )

    @override
    def _build_rule(self, config: HalvingConfig, store: RungStore | None) -> Any:
        return SuccessiveHalvingRule(config, rounding=self.rounding)

    @override
    def _judge(self, reports: list[TrialReport], *, together: bool) -> list[Decision]:
        budgets = sorted({report.budget for report in reports})
        if len(budgets) > 1:
            raise RuntimeError(
                f"SuccessiveHalving: the running trials have trained different budgets {budgets} ({self.time_attr}); "
                "synchronous halving judges a cohort that trains in lockstep. A trial added to the group after the "
                "start breaks the cohort: use ASHA, which judges trials as they arrive."
            )
        decisions = self.rule.report_rung({report.trial_id: report.value for report in reports}, budgets[0])
        return [decisions[report.trial_id] for report in reports]

    @override
    def _settings(self) -> dict[str, Any]:
        return {**super()._settings(), "rounding": self.rounding}
