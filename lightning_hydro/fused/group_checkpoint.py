"""What a fused group adds to a Lightning checkpoint, and how it comes back.

Lightning saves the stacked tensors (the module's state dict) and the group optimizer's state (every trial's
own optimizer and schedulers, by trial id). The group adds its slot map, every trial's record, the retired
trials' weights, how to rebuild each trial's module, the backend in use, and the trials found diverged but not
yet out of their slots (they are stopped when the fit resumes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn

from lightning_hydro.fused.backend_policy import BackendPolicy
from lightning_hydro.fused.step.row_health import HealthReadback
from lightning_hydro.fused.trial_slots import TrialSlots
from lightning_hydro.fused.trial_specs import module_spec, rebuild_trials
from lightning_hydro.stacking.stacked_state import StackedState, storage_key

__all__ = ["CHECKPOINT_KEY", "group_state", "restore_group"]

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
