"""What an early-stopping callback sees of the trials it judges: a fused group, or the one trial of this process.

:class:`~lightning_hydro.callbacks.halving_callback.HalvingCallback` asks a :class:`TrialsView` for the running
trials, their budgets and monitored values, and hands it the trials to stop; it never asks which kind of run it
is in. :func:`open_trials_view` picks the implementation once, when fit starts:

- :class:`~lightning_hydro.callbacks.fused_trials.FusedTrials`: the trials of a
  :class:`~lightning_hydro.FusedLightningModule`; rung records in memory unless ``storage`` is given.
- :class:`~lightning_hydro.callbacks.process_trial.ProcessTrial`: an ordinary LightningModule, one trial per
  process; rung records shared by the processes, by default in the SQLite file :data:`DEFAULT_STORE_FILE`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol

import lightning as L

from lightning_hydro.callbacks.callback_arguments import default_trial_id, open_storage
from lightning_hydro.callbacks.trial_ending import TrialEnding
from lightning_hydro.stopping import RungStore, TimeAttr, TrialId, TrialStatus

__all__ = ["DEFAULT_STORE_FILE", "TrialsView", "open_trials_view"]

DEFAULT_STORE_FILE = "lightning_hydro_rungs.db"
"""The SQLite file, in the Trainer's ``default_root_dir``, that one-trial-per-process runs share by default."""


class TrialsView(Protocol):
    """The trials a callback judges, whatever trains them."""

    together: bool
    """Whether the trials reporting at one decision point are judged together (a fused group)."""

    takes_new_trials: bool
    """Whether freed slots can take new trials (``refill=``)."""

    status: TrialStatus
    """One trial per process: how the trial stands (``"running"`` until it ends). A fused group: ``"running"``."""

    def running(self) -> list[TrialId]:
        """The running trials' ids (the ids endings and results name)."""
        ...

    def rule_key(self, trial_id: TrialId) -> TrialId:
        """The id under which the rule (and its shared store) knows the trial."""
        ...

    def budget(self, trial_id: TrialId) -> int:
        """Epochs or steps the trial has trained since it entered the run."""
        ...

    def values(self, *, epoch_end: bool) -> dict[TrialId, float | None]:
        """Each running trial's latest monitored value; ``epoch_end``: at the end of a training epoch.

        Raises:
            RuntimeError: If the trials do not log ``monitor`` at all.
        """
        ...

    def stop(self, ending: TrialEnding) -> None:
        """End one running trial."""
        ...

    def units_done(self) -> int:
        """Budget units the run has trained so far (for timing them)."""
        ...

    def batch_ended(self, batch_idx: int) -> None:
        """A training batch ended (before the module's own ``on_train_batch_end``)."""
        ...

    def epoch_ended(self) -> None:
        """A training epoch ended."""
        ...

    def sanity_check_ended(self) -> None:
        """Lightning's sanity check (a short validation before training) ended."""
        ...

    def train_started(self) -> None:
        """Training starts (or resumes)."""
        ...

    def free_slots(self) -> int:
        """How many new trials the run can take now."""
        ...

    def add(self, module: L.LightningModule, trial_id: int | None) -> TrialId:
        """Start a new trial in a free slot; returns its id."""
        ...

    def ended(self) -> tuple[dict[TrialId, int], dict[TrialId, str]]:
        """At the end of fit: the budget and status of every trial of the run."""
        ...

    def final_result(self, endings: Mapping[TrialId, TrialEnding]) -> dict[str, Any]:
        """At the end of fit, one trial per process: its result (``HalvingCallback.result``); a fused group: ``{}``."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to resume the view."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        ...


def open_trials_view(
    trainer: L.Trainer,
    module: L.LightningModule,
    *,
    monitor: str,
    owner: str,
    time_attr: TimeAttr,
    trial_id: TrialId | None,
    store: RungStore | None,
    namespace: str,
) -> tuple[TrialsView, RungStore | None]:
    """The view of ``module``'s trials, and the rung store its rule records into (None: in memory).

    Args:
        trainer: The Trainer that fits ``module``.
        module: A :class:`~lightning_hydro.FusedLightningModule` or an ordinary LightningModule.
        monitor: The metric that ranks trials.
        owner: The callback's name, for error messages.
        time_attr: What a budget counts.
        trial_id: The callback's ``trial_id``: one trial per process, the trial's id in the store (default: the
            Hydra job's ``"job{n}"``, else a random id); a fused group in a shared store, its ids' prefix.
        store: The callback's ``storage``, opened; None if it was not given.
        namespace: The sweep's name in the store.
    """
    # Imported here: each implements the protocol above, so each imports this module.
    from lightning_hydro.callbacks.fused_trials import FusedTrials
    from lightning_hydro.callbacks.process_trial import ProcessTrial
    from lightning_hydro.fused import FusedLightningModule

    key = trial_id if trial_id is not None else default_trial_id()
    if isinstance(module, FusedLightningModule):
        prefix = None if store is None else str(key)
        return FusedTrials(trainer, module, monitor, owner, time_attr, prefix), store
    if store is None:
        store = open_storage(owner, os.path.join(trainer.default_root_dir, DEFAULT_STORE_FILE), namespace)
    return ProcessTrial(trainer, key, monitor, owner, time_attr), store
