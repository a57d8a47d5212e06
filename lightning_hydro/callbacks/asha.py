"""``ASHA``: asynchronous successive halving, for a fused group (with refill) or one trial per process."""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_hydro.callbacks.halving_callback import HalvingCallback
from lightning_hydro.stopping import AsyncSuccessiveHalving, HalvingConfig, RungStore

__all__ = ["ASHA"]


class ASHA(HalvingCallback):
    """Stop trials with asynchronous successive halving (Li et al., MLSys 2020), stopping variant.

    When a trial reaches a rung milestone (``grace_period * reduction_factor**k`` epochs or steps since it
    entered its slot, up to ``max_t``), its ``monitor`` value is recorded at the rung and the trial stops if the
    value is worse than the ``1 - 1/reduction_factor`` quantile of the values recorded there before it. Trials of a
    fused group that reach a rung together are judged together, so a group that starts together is cut exactly as
    synchronous successive halving would cut it; trials that joined later through ``refill`` are judged against
    everything recorded at the rung before them. Trials reaching ``max_t`` are stopped as ``completed``; a NaN or
    infinite value stops a trial as ``diverged``.

    With an ordinary LightningModule (one trial per process), the processes share the rung records through
    ``storage``: decisions equal those of one process seeing the same reports in the store's arrival order.

    Takes every argument of :class:`~lightning_hydro.callbacks.halving_callback.HalvingCallback`.

    Raises:
        ValueError: For a mode other than min/max, ``reduction_factor <= 1``, ``grace_period < 1`` or above
            ``max_t``, an unknown ``time_attr``, and (when fit starts) ``max_t`` beyond the Trainer's limits or
            ``refill`` with an ordinary LightningModule.
        StoreOpenError: If ``storage`` cannot be opened.
        RuntimeError: At the end of the first validation (or training epoch), if ``monitor`` is not logged; the
            message lists what is.

    With one trial per process, e.g. ``python train.py -m lr=0.001,0.01,0.1``, every job shares ``asha.db``::

        trainer = L.Trainer(max_epochs=27, callbacks=[ASHA(monitor="val_acc", mode="max", storage="asha.db")])
        trainer.fit(MyModule(lr=lr), datamodule)
        print(trainer.callbacks[0].status)   # "completed", "stopped" or "diverged"

    Example::

        >>> import lightning as L
        >>> from lightning_hydro import FusedLightningModule
        >>> from lightning_hydro.demos import DigitsDataModule, DigitsMLP
        >>> trials = [DigitsMLP(hidden_dim=16, lr=lr) for lr in (0.001, 0.01, 0.1)]
        >>> more = [DigitsMLP(hidden_dim=16, lr=lr) for lr in (0.05, 0.2)]   # the rest of the search space
        >>> asha = ASHA(monitor="val_loss", mode="min", grace_period=1, reduction_factor=3, max_t=3, refill=more)
        >>> trainer = L.Trainer(max_epochs=3, callbacks=[asha], logger=False, enable_progress_bar=False,
        ...                     enable_checkpointing=False, enable_model_summary=False, limit_train_batches=4)
        >>> fused = FusedLightningModule(trials, backend="vmap", summary=False)
        >>> trainer.fit(fused, datamodule=DigitsDataModule())
        >>> sorted(fused.results), sorted({r["status"] for r in fused.results.values()})
        ([0, 1, 2, 3, 4], ['completed', 'stopped'])
        >>> asha.budget.exhaustive   # 5 trials trained to max_t=3 would cost 15 trial-epochs
        15
    """

    @override
    def _build_rule(self, config: HalvingConfig, store: RungStore | None) -> Any:
        return AsyncSuccessiveHalving(config, store)
