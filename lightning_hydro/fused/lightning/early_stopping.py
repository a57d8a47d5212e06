"""``TrialEarlyStopping``: the user's ``EarlyStopping`` acting per trial in a fused group.

A user who trains one model writes ``EarlyStopping(monitor="val/acc", patience=3)``. In a fused group
(:func:`~lightning_hydro.fused.lightning.callbacks.per_trial_callbacks` puts this callback in its place at fit
start) each trial has a copy of it, which decides on the trial's own metric with the user's settings; a trial it
stops leaves its slot (``stop_trial``), and the fit ends when no trial is left.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping
from typing_extensions import override

from lightning_hydro.fused.lightning.callback_view import TrialCopies

__all__ = ["TrialEarlyStopping", "may_stop_early"]


class TrialEarlyStopping(EarlyStopping):
    """The user's ``EarlyStopping`` per trial: a copy per trial stops that trial through its slot.

    As in an unfused run, a stop decided before ``Trainer(min_epochs=..., min_steps=...)`` is reached waits until
    it is; the fit stops when every trial has stopped (or at its own limits).

    Args:
        template: the user's ``EarlyStopping``; each trial's copy has its settings.
    """

    def __init__(self, template: EarlyStopping) -> None:
        super().__init__(monitor=template.monitor, patience=template.patience, mode=template.mode)
        self.template = template
        self._trials = TrialCopies(template)
        self._pending_stops: dict[int, str] = {}

    @property
    def trial_callbacks(self) -> dict[int, EarlyStopping]:
        """Each trial's ``EarlyStopping``, by trial id (``wait_count``, ``best_score``, ``stopped_epoch``)."""
        return dict(self._trials.copies)  # type: ignore[arg-type]

    def _check(self, trainer: L.Trainer, fused: Any, hook: str) -> None:
        for tid, callback, view in self._trials.run(trainer, fused, fused.trial_ids):
            getattr(callback, hook)(view, view.lightning_module)
            if view.should_stop and tid not in self._pending_stops:
                reason = getattr(callback, "stopping_reason_message", None) or "no improvement"
                self._pending_stops[tid] = f"EarlyStopping(monitor={self.monitor!r}): {reason}"
        if self._pending_stops and may_stop_early(trainer):
            for tid, reason in list(self._pending_stops.items()):
                if tid in fused.trial_ids:
                    fused.stop_trial(tid, reason)
            self._pending_stops.clear()
            if not fused.trial_ids:
                self.stopped_epoch = trainer.current_epoch
                if hook == "on_train_epoch_end":
                    # Lightning runs EarlyStopping's on_train_epoch_end after the module's, where the group ends
                    # its fit once no trial runs: end it here, as EarlyStopping ends an unfused fit
                    trainer.should_stop = True

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._trials.stage = stage

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer, pl_module, "on_train_epoch_end")

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer, pl_module, "on_validation_end")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "trials": self._trials.state_dict(), "pending_stops": self._pending_stops}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        self._trials.pending_states.update(state.pop("trials", {}))
        self._pending_stops = dict(state.pop("pending_stops", {}))
        super().load_state_dict(state)


def may_stop_early(trainer: L.Trainer, *, epoch_ends: bool = True) -> bool:
    """Lightning's rule: ``should_stop`` takes effect once ``min_epochs`` and ``min_steps`` are reached.

    ``epoch_ends``: the check runs at the end of the current epoch, which counts as done (else only the epochs before
    it do: a stop within an epoch waits for its end while ``min_epochs`` is not reached).
    """
    min_epochs, min_steps = trainer.fit_loop.min_epochs, trainer.fit_loop.min_steps
    epochs_done = trainer.current_epoch + int(epoch_ends)
    return (not min_epochs or epochs_done >= min_epochs) and (not min_steps or trainer.global_step >= min_steps)
