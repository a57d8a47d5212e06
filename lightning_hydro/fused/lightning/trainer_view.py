"""``TrialTrainerView``: what a fused trial's ``self.trainer`` is, so its code sees the Trainer of an unfused run.

In a fused run the real Trainer drives the :class:`~lightning_hydro.FusedLightningModule`, so
``trainer.model`` and ``trainer.lightning_module`` are the fused wrapper and the trainer's metrics carry
per-trial keys (``"val/loss/trial_3"``). A trial's own code expects its unfused run: lightning-hydra-template
builds its optimizer from ``self.trainer.model.parameters()`` (the FSDP-friendly form), a hook may read
``self.trainer.callback_metrics["val/loss"]``, and Lightning's own accessors read the Trainer: ``self.optimizers()``
(``trainer.strategy._lightning_optimizers``), ``self.lr_schedulers()`` (``trainer.lr_scheduler_configs``),
``self.manual_backward`` and ``toggle_optimizer`` (``trainer.strategy``, ``trainer.optimizers``). Each trial module
is therefore attached to a view of the real Trainer that answers those questions for that trial (the optimizers
and schedulers the trial's own ``configure_optimizers`` built: see :mod:`.strategy_view`) and forwards everything
else (attribute reads and writes) to the real Trainer.

Example::

    >>> import lightning as L
    >>> trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False)
    >>> trial = L.LightningModule()
    >>> view = TrialTrainerView(trainer, trial, trial_id=3)
    >>> view.model is trial, view.lightning_module is trial, view.max_epochs == trainer.max_epochs
    (True, True, True)
    >>> trainer.callback_metrics.update({"val/loss/trial_3": 0.5, "val/loss/trial_4": 0.7})
    >>> dict(view.callback_metrics)
    {'val/loss': 0.5}
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import lightning as L
from lightning.pytorch.utilities.types import LRSchedulerConfig
from torch.optim import Optimizer

from lightning_hydro.fused.lightning.strategy_view import (
    TrialOptimizerSource,
    TrialStrategyView,
    refuse_inside_vmap,
    scheduler_configs_of,
)

__all__ = ["TrialStopRequests", "TrialTrainerView", "attach_trainer", "own_hook", "trial_metrics_view"]

# The trainer's metric dictionaries, answered per trial under the trial's own (unfused) names.
_METRIC_VIEWS = ("callback_metrics", "logged_metrics", "progress_bar_metrics")
_OWN = ("_trainer", "_trial", "_trial_id", "_source", "_strategy_view", "_stops")

# the trial whose own hook runs now, one trial's call (call_trial_hook), and the hook's name
_OWN_HOOK: ContextVar[tuple[int, str] | None] = ContextVar("lightning_hydro_own_hook", default=None)


@contextmanager
def own_hook(trial_id: int, hook: str) -> Iterator[None]:
    """Code run inside is trial ``trial_id``'s own ``hook``, for it alone: its ``trainer.should_stop`` is its own."""
    token = _OWN_HOOK.set((trial_id, hook))
    try:
        yield
    finally:
        _OWN_HOOK.reset(token)


class TrialStopRequests:
    """``self.trainer.should_stop = True`` set in a trial's own hook: a request to stop that trial, not the group.

    Alone, a module's hook that sets ``should_stop`` (a target accuracy reached in ``on_validation_epoch_end``, a
    non-finite loss seen in ``on_train_batch_end``) ends its own run. Fused, the group stops that trial when its
    hooks of the batch or epoch have run (:meth:`FusedLightningModule._stop_requested_trials`), and the other trials
    go on. Set in a step or in code run once for every trial (vmap, hfta), it still ends the whole fit: every trial
    ran it.

    ``pending``: the requesting trials, with the hook that asked.
    """

    def __init__(self) -> None:
        self.pending: dict[int, str] = {}


def trial_metrics_view(metrics: Mapping[str, Any], trial_id: int) -> dict[str, Any]:
    """The entries ``"{name}/trial_{trial_id}"`` of ``metrics``, under ``name``.

    Example::

        >>> trial_metrics_view({"val/acc/trial_1": 0.9, "val/acc/trial_2": 0.8, "trials": 2.0}, 1)
        {'val/acc': 0.9}
    """
    suffix = f"/trial_{trial_id}"
    return {key[: -len(suffix)]: value for key, value in metrics.items() if key.endswith(suffix)}


class TrialTrainerView:
    """The real Trainer as one fused trial sees it.

    ``model`` and ``lightning_module`` are the trial module; ``callback_metrics``, ``logged_metrics`` and
    ``progress_bar_metrics`` hold the trial's own entries under their unfused names (a copy: writing to it
    changes nothing). With a ``source``, ``optimizers``, ``lr_scheduler_configs`` and ``strategy`` answer with
    the trial's own optimizers and schedulers (so ``self.optimizers()`` and ``self.lr_schedulers()`` do).
    Every other attribute is read from, and written to, the real Trainer.

    Args:
        trainer: the Trainer that fits the fused module.
        trial: the trial module.
        trial_id: the trial's id in the fused group.
        source: where the trial's optimizers are kept (the fused module's); None: the Trainer's are answered.
    """

    _trainer: L.Trainer
    _trial: L.LightningModule
    _trial_id: int
    _source: TrialOptimizerSource | None
    _strategy_view: TrialStrategyView | None
    _stops: TrialStopRequests | None

    def __init__(
        self,
        trainer: L.Trainer,
        trial: L.LightningModule,
        trial_id: int,
        source: TrialOptimizerSource | None = None,
        stops: TrialStopRequests | None = None,
    ) -> None:
        object.__setattr__(self, "_trainer", trainer)
        object.__setattr__(self, "_trial", trial)
        object.__setattr__(self, "_trial_id", trial_id)
        object.__setattr__(self, "_source", source)
        object.__setattr__(self, "_strategy_view", None)
        object.__setattr__(self, "_stops", stops)

    @property
    def trainer(self) -> L.Trainer:
        """The real Trainer behind this view."""
        return self._trainer

    @property
    def trial_id(self) -> int:
        """The trial this view answers for."""
        return self._trial_id

    @property
    def model(self) -> L.LightningModule:
        """The trial module (in an unfused run, ``trainer.model`` is the module being fit)."""
        return self._trial

    @property
    def lightning_module(self) -> L.LightningModule:
        """The trial module."""
        return self._trial

    @property
    def strategy(self) -> Any:
        """The strategy as the trial sees it (its own optimizers, backward and steps: :mod:`.strategy_view`)."""
        if self._source is None:
            return self._trainer.strategy
        view = self._strategy_view
        if view is None or view._strategy is not self._trainer.strategy:
            view = TrialStrategyView(self._trainer.strategy, self._trial, self._trial_id, self._source)
            object.__setattr__(self, "_strategy_view", view)
        return view

    @property
    def optimizers(self) -> list[Optimizer]:
        """The trial's own optimizers (``toggle_optimizer`` and ``self.optimizers(use_pl_optimizer=False)`` read it)."""
        if self._source is None:
            return self._trainer.optimizers
        refuse_inside_vmap(self._source, "self.trainer.optimizers")
        optimization = self._source.optimization(self._trial_id)
        return [] if optimization is None else optimization.optimizers

    @property
    def lr_scheduler_configs(self) -> list[LRSchedulerConfig]:
        """The trial's own LR schedulers, with the configuration its ``configure_optimizers`` returned."""
        if self._source is None:
            return self._trainer.lr_scheduler_configs
        refuse_inside_vmap(self._source, "self.lr_schedulers()")
        return scheduler_configs_of(self._source.optimization(self._trial_id))

    def __getattr__(self, name: str) -> Any:
        if name in _OWN or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)  # e.g. copy/pickle probing a half-built view: not the Trainer's business
        if name in _METRIC_VIEWS:
            return trial_metrics_view(getattr(self._trainer, name), self._trial_id)
        if name == "should_stop" and self._stops is not None and self._trial_id in self._stops.pending:
            return True  # it asked to stop, as alone it reads its own request back
        return getattr(self._trainer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN or name in ("model", "lightning_module", "trainer", "trial_id", "strategy"):
            raise AttributeError(f"TrialTrainerView: {name!r} is read-only (it answers for trial {self._trial_id}).")
        own = _OWN_HOOK.get()
        if name == "should_stop" and self._stops is not None and own is not None and own[0] == self._trial_id:
            if value:  # its own hook's request: this trial stops (TrialStopRequests), not the group
                self._stops.pending.setdefault(self._trial_id, own[1])
            else:
                self._stops.pending.pop(self._trial_id, None)
            return
        setattr(self._trainer, name, value)

    def __repr__(self) -> str:
        return f"TrialTrainerView(trial_id={self._trial_id}, trainer={self._trainer!r})"


def attach_trainer(
    trial: L.LightningModule,
    trainer: L.Trainer | None,
    trial_id: int,
    source: TrialOptimizerSource | None = None,
    stops: TrialStopRequests | None = None,
) -> None:
    """Attach ``trial`` to a view of ``trainer`` (or detach it, with None).

    ``source`` holds its optimizers; ``stops`` takes its own hooks' ``should_stop`` requests.
    """
    view = None if trainer is None else TrialTrainerView(trainer, trial, trial_id, source, stops)
    trial.trainer = view  # type: ignore[assignment]
