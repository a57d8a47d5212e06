"""What a fused group adds to a Lightning checkpoint, and how it comes back.

Lightning saves the stacked tensors (the module's state dict) and the group optimizer's state (every trial's
own optimizer and schedulers, by trial id). The group adds its slot map, every trial's record, the retired
trials' weights, how to rebuild each trial's module, the backend in use, the trials found diverged but not
yet out of their slots (they are stopped when the fit resumes), and what each trial's own ``on_save_checkpoint``
added (:mod:`.trial_checkpoint_hooks`: given back to its ``on_load_checkpoint``).

That checkpoint is the **group checkpoint**: ``TrialModelCheckpoint`` writes it into the user's ``dirpath`` (its
``group_model_path``, and ``last.ckpt`` with ``save_last``), ``trainer.save_checkpoint`` writes one too. It resumes
the group (``trainer.fit(fused, ckpt_path=...)``), evaluates every trial (``trainer.test(fused, ckpt_path=...)``),
and :func:`load_group_checkpoint` (``FusedLightningModule.load_group_checkpoint``) builds the group from it without
a Trainer. A trial's own checkpoint (per-trial ``ModelCheckpoint``, ``{dirpath}/trial_{id}/``) given to a fused
group for evaluation stands for the group checkpoint of the callback that wrote it
(:func:`group_checkpoint_for_trial`): ``trainer.test(fused, ckpt_path=trainer.checkpoint_callback.best_model_path)``
tests every trial.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import lightning as L
from lightning.fabric.utilities.cloud_io import _load as pl_load
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from lightning_hydro.fused.group.slots import TrialSlots
from lightning_hydro.fused.group.specs import module_spec, rebuild_trials
from lightning_hydro.fused.lightning.callback_view import TRIAL_CHECKPOINT_KEY
from lightning_hydro.fused.lightning.model_checkpoint import TrialModelCheckpoint
from lightning_hydro.fused.lightning.trial_checkpoint_hooks import ENTRIES_KEY, load_trial_entries
from lightning_hydro.fused.step.backend_policy import BackendPolicy
from lightning_hydro.fused.step.row_health import HealthReadback
from lightning_hydro.stacking.stacked_state import StackedState, storage_key

if TYPE_CHECKING:
    from lightning_hydro.fused.module import FusedLightningModule

__all__ = [
    "CHECKPOINT_KEY",
    "group_checkpoint_for_trial",
    "group_state",
    "load_group_checkpoint",
    "recorded_trials",
    "restore_group",
]

CHECKPOINT_KEY = "lightning_hydro"


def group_state(
    slots: TrialSlots, policy: BackendPolicy, pending: HealthReadback, *, epoch_done: bool
) -> dict[str, Any]:
    """The group's entry of a checkpoint; ``pending`` (not yet read back) and an ended epoch are settled in it.

    A checkpoint written by a callback's ``on_train_batch_end`` runs before the module's own hook settles the
    batch, and Lightning does not rerun that batch's hooks on resume.
    """
    book = slots.book
    if pending.steps or pending.diverged or epoch_done:
        book = book.settled(pending.steps, slots.trial_ids, epoch_done=epoch_done)
    return {
        "trial_ids": list(slots.trial_ids),
        "max_slots": slots.max_slots,
        "backend": policy.recorded_name,
        "records": book.results(),
        "epoch": book.epoch_state(),
        "diverged": {tid: reason for tid, (reason, _) in pending.diverged.items()},  # stopped on resume
        "retired": {tid: {k: v.detach().cpu() for k, v in m.state_dict().items()} for tid, m in slots.retired.items()},
        "specs": {tid: module_spec(slots.module(tid)) for tid in slots.book.records},  # type: ignore[arg-type]
    }


def recorded_trials(slots: TrialSlots) -> list[tuple[int, L.LightningModule]]:
    """``(trial id, module)`` of every trial the group keeps a record of, running or ended."""
    return [(tid, slots.module(tid)) for tid in slots.book.records]  # type: ignore[misc]


def restore_group(
    checkpoint: dict[str, Any],
    slots: TrialSlots,
    policy: BackendPolicy,
    trial_factory: Callable[[int], Any] | None,
    *,
    fitting: bool = True,
) -> dict[int, str]:
    """Load the group's entry into ``slots`` and ``policy``; returns the trials to stop as diverged on resume.

    A checkpoint written after every trial had ended restores for evaluation (``fitting=False``: each trial's
    weights come back in its retired module, and the group's rows are empty), not for a fit.

    Raises:
        KeyError: if the checkpoint was not written by a fused module.
        ValueError: for a fit, if every trial had ended when it was written (nothing left to train).
    """
    if CHECKPOINT_KEY not in checkpoint:
        raise KeyError(
            "This checkpoint was not written by a FusedLightningModule (it has no 'lightning_hydro' entry); "
            "load it into the trial module's own class instead."
        )
    data = checkpoint[CHECKPOINT_KEY]
    if not data["trial_ids"] and fitting:
        ended = ", ".join(str(tid) for tid in sorted(data["records"]))
        raise ValueError(
            f"This FusedLightningModule checkpoint holds no running trial (trials {ended} had all ended when it was "
            "written), so a fit cannot resume from it: there is nothing left to train. Evaluate it with "
            "trainer.test / trainer.validate / trainer.predict(ckpt_path=...) (every trial, with its own weights), "
            "or start a new fit without ckpt_path."
        )
    current: dict[int, nn.Module] = {**slots.retired, **dict(slots.running())}
    known = rebuild_trials(data["specs"], current, trial_factory)  # type: ignore[arg-type]
    slots.replace(known, list(data["trial_ids"]))  # type: ignore[arg-type]
    if not data["trial_ids"]:
        slots.group.reshape_empty(_rowless_shapes(slots.group, checkpoint.get("state_dict", {})))
    for tid, state in data["retired"].items():
        slots.retired[tid].load_state_dict(state)
    slots.book.load(data["records"])
    if "epoch" in data:  # absent from checkpoints of earlier versions
        slots.book.load_epoch_state(data["epoch"])
    slots.max_slots = data["max_slots"]
    policy.restore(data.get("backend"))
    return dict(data.get("diverged", {}))


def _rowless_shapes(group: StackedState, state_dict: Mapping[str, Tensor]) -> dict[str, tuple[int, ...]]:
    """The checkpoint's shapes of the group's stacked tensors, by trial tensor name (a group without rows).

    The state dict's keys are ``{the storage module's path}.{storage key}``; storage keys hold no dot.
    """
    recorded = {key.rpartition(".")[2]: tuple(value.shape) for key, value in state_dict.items()}
    names = [*group.params, *group.buffers]
    return {name: recorded[storage_key(name)] for name in names if storage_key(name) in recorded}


def _writer_of(path: Any, trainer: L.Trainer) -> TrialModelCheckpoint | None:
    """The Trainer's per-trial ``ModelCheckpoint`` whose ``{dirpath}/trial_{id}/`` holds ``path``."""
    if path is None:
        return None
    group_dir = os.path.realpath(os.path.dirname(os.path.dirname(os.fspath(path))))
    for callback in trainer.checkpoint_callbacks:
        dirpath = getattr(callback, "dirpath", None)
        if isinstance(callback, TrialModelCheckpoint) and dirpath and os.path.realpath(dirpath) == group_dir:
            return callback
    return None


def group_checkpoint_for_trial(
    checkpoint: Mapping[str, Any], trainer: L.Trainer | None, *, fitting: bool
) -> dict[str, Any] | None:
    """For a trial's own checkpoint given to a fused group, the group checkpoint to restore instead (else None).

    ``trainer.test(fused, ckpt_path=trainer.checkpoint_callback.best_model_path)`` names the best trial's own
    checkpoint; the group checkpoint that the same per-trial ``ModelCheckpoint`` wrote last holds every trial, so
    test/validate/predict restore that one and evaluate every trial, as from the group checkpoint itself.

    Raises:
        ValueError: for a fit (a fit resumes from the group checkpoint, named so), or where no callback of this
            Trainer wrote the trial's checkpoint (a new process): the message names the checkpoint to pass.
    """
    entry = checkpoint.get(TRIAL_CHECKPOINT_KEY)
    if CHECKPOINT_KEY in checkpoint or not isinstance(entry, Mapping):
        return None
    path = None if trainer is None else trainer.ckpt_path
    writer = None if trainer is None else _writer_of(path, trainer)
    group_path = "" if writer is None else writer.group_model_path
    own = (
        f"{path or 'This checkpoint'} is trial {entry['trial_id']}'s own checkpoint (written by a per-trial "
        "ModelCheckpoint): load it into the trial's class, MyModule.load_from_checkpoint(path), to use that trial. "
    )
    if fitting:
        where = f" ({group_path})" if group_path else ""
        raise ValueError(
            own + "A fused group resumes from its group checkpoint: pass trainer.checkpoint_callback.group_model_path"
            f"{where} or last.ckpt in the callback's dirpath."
        )
    if not group_path:
        raise ValueError(
            own + "To evaluate every trial of the group, pass its group checkpoint (the .ckpt files directly in the "
            "callback's dirpath, e.g. last.ckpt, or trainer.checkpoint_callback.group_model_path on the Trainer "
            "that fitted it), or use that Trainer, which finds it by itself."
        )
    # a warning, not a note: ckpt_path="best" (lightning-hydra-template's train.py) evaluates each trial alone at
    # its best weights, and the group checkpoint holds each trial's latest ones
    rank_zero_warn(
        f"FusedLightningModule: {path} is trial {entry['trial_id']}'s own checkpoint; every trial of the group is "
        f"restored from the group checkpoint {group_path}, which holds each trial's weights of when it was written "
        "(the latest), not each trial's best as ckpt_path='best' gives a trial alone. To evaluate a trial at its "
        "best, load its own checkpoint into its class: MyModule.load_from_checkpoint(path).",
        category=UserWarning,
    )
    assert trainer is not None
    # written by this Trainer's own callback in this run; it holds the trials' hyperparameters (e.g. partials)
    return trainer.strategy.load_checkpoint(group_path, weights_only=False)


def load_group_checkpoint(
    cls: type[FusedLightningModule],
    path: Any,
    *,
    trial_factory: Callable[[int], Any] | None = None,
    map_location: Any = None,
    weights_only: bool | None = None,
    **kwargs: Any,
) -> FusedLightningModule:
    """A fused group built from its group checkpoint, without a Trainer (see ``FusedLightningModule``).

    Raises:
        ValueError: ``path`` is not a group checkpoint (the message says what to do with a trial's own).
    """
    checkpoint = pl_load(path, map_location=map_location or "cpu", weights_only=weights_only)
    if CHECKPOINT_KEY not in checkpoint:
        kind = "a trial's own checkpoint" if TRIAL_CHECKPOINT_KEY in checkpoint else "not a FusedLightningModule's"
        raise ValueError(
            f"FusedLightningModule.load_group_checkpoint: {path} is {kind}; load a trial's checkpoint into its "
            "own class (MyModule.load_from_checkpoint), and pass a group checkpoint here (the .ckpt files directly "
            "in the per-trial ModelCheckpoint's dirpath, or what trainer.save_checkpoint wrote for a fused group)."
        )
    data = checkpoint[CHECKPOINT_KEY]
    modules = rebuild_trials(data["specs"], {}, trial_factory)
    ids = sorted(modules)
    fused = cls([modules[tid] for tid in ids], trial_ids=ids, trial_factory=trial_factory, **kwargs)
    restore_group(checkpoint, fused._slots, fused._policy, trial_factory, fitting=False)
    load_trial_entries(checkpoint, data.get(ENTRIES_KEY), recorded_trials(fused._slots))  # as load_from_checkpoint
    fused.load_state_dict(checkpoint["state_dict"])
    return fused
