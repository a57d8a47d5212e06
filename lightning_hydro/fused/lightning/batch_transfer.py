"""The trials' own batch-transfer hooks (``on_before_batch_transfer``, ``transfer_batch_to_device``, ``on_after_...``).

Lightning calls these hooks of the module it fits (of the DataModule instead, where that overrides one) on every
batch before the step: to normalise or augment it on the device, to move a batch of a custom type. Before, a fused
group did not have them, so Lightning called its own defaults and the trials trained on the raw batch, silently
(weights 0.27 relative from alone for a normalising ``on_after_batch_transfer``). The fused module now has each hook
its trials override (only those: Lightning warns about a module's hook that a DataModule's overrides, as alone).

A group feeds all its trials one batch, so:

- a hook whose code reads no value that differs between the trials and stores no Python state runs once, on the
  first running trial's module, and the batch it gives is every trial's; one whose code reads a value that differs
  between the trials (an augmentation strength searched as a hyperparameter) would give each trial a batch of its
  own, which a group cannot feed: it is refused, naming the values, and the remedy (do it in the step, which runs
  per trial);
- a hook that stores Python state (``self.batches_seen += 1``, ``self.seen["train"] += 1``) runs for each trial in
  turn, on a batch of the trial's own (:class:`~lightning_hydro.backends.batch_copies.BatchRuns`), so that each
  trial's state is as alone. Each run starts from the same random-number state (the generators end as one run left
  them), so a random augmentation draws for every trial what it draws alone; the batches the trials' hooks give are
  then compared, and the first trial's feeds the group where they are equal. Where they differ (the hook scales by a
  hyperparameter, or its state differs between the trials and it reads that state: a trial that joined later), it
  is refused, naming the hook, the trials and the first entry that differs.

What a hook's code reads and stores is read off the code
(:func:`~lightning_hydro.backends.trial_attributes.hook_reads`, :func:`~.trial_attributes.hook_writes`), as for the
steps: it errs towards refusing, and towards running per trial.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_hydro.backends.batch_copies import BatchRuns, first_difference
from lightning_hydro.backends.compile_check import rng_states, set_rng_states
from lightning_hydro.backends.errors import FusionError
from lightning_hydro.backends.python_state import state_generation, trial_code_ran
from lightning_hydro.backends.trial_attributes import DifferingAttribute, hook_reads, hook_writes
from lightning_hydro.fused.group.slots import TrialSlots
from lightning_hydro.fused.lightning.hooks import call_trial_hook

__all__ = ["TRANSFER_HOOKS", "BatchTransfer"]

TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


class BatchTransfer:
    """Runs the trials' batch-transfer hooks for the fused module (see the module's docstring).

    Args:
        slots: the group's slots (the running trials and their modules).
        trial: one of the trials (a group's trials share their code).
    """

    def __init__(self, slots: TrialSlots, trial: L.LightningModule) -> None:
        self.slots = slots
        self.overridden = tuple(hook for hook in TRANSFER_HOOKS if is_overridden(hook, trial, L.LightningModule))
        self._each = {hook: bool(hook_writes(type(trial), hook)) for hook in self.overridden}
        self._checked: dict[str, tuple[tuple[int, ...], int]] = {}  # each hook's trials and state, found fusible

    def install(self, fused: L.LightningModule) -> None:
        """Give ``fused`` each hook its trials override (Lightning then calls it instead of its default)."""
        for hook in self.overridden:  # (a method of this object: a module pickled for ddp_spawn keeps it)
            fused.__dict__[hook] = getattr(self, hook)

    def run(self, hook: str, batch: Any, *args: Any) -> Any:
        """The batch after the trials' ``hook`` (``args``: Lightning's arguments after the batch)."""
        group = self.slots.group
        modules, ids = list(group.modules), list(group.trial_ids)
        if not ids:  # every trial has ended: nothing trains on the batch
            return batch
        if self._each[hook]:
            return self._run_each(hook, modules, ids, batch, *args)
        differing = self._differing(hook, modules, ids)
        if differing:
            shown = "; ".join(str(attribute) for attribute in differing[:4])
            raise FusionError(
                f"FusedLightningModule: {type(modules[0]).__name__}.{hook} reads values that differ between the "
                f"trials ({shown}), so each trial would get a batch of its own; a fused group feeds all its trials "
                "one batch. Do the per-trial part in training_step (which runs per trial), or train these trials "
                "in separate groups."
            )
        return call_trial_hook(hook, ids[0], modules[0], batch, *args, shared=True)[0]

    def _run_each(self, hook: str, modules: list[Any], ids: list[int], batch: Any, *args: Any) -> Any:
        """Every trial's ``hook``, each from the same random-number state; the first's batch, if all give it."""
        trial_code_ran()  # each trial's hook changes its own Python state
        device = self.slots.group.device
        states = rng_states(device)
        batches = BatchRuns(batch, len(ids))
        results = []
        for tid, module in zip(ids, modules):
            set_rng_states(device, states)  # each trial draws what the first draws (the state after: one run's)
            results.append(call_trial_hook(hook, tid, module, batches.next(), *args)[0])
        for tid, result in zip(ids[1:], results[1:]):
            where = first_difference(results[0], result)
            if where is not None:
                raise FusionError(
                    f"FusedLightningModule: {type(modules[0]).__name__}.{hook} gives trial {tid} another batch than "
                    f"trial {ids[0]} ({where}); a fused group feeds all its trials one batch. The hook runs for each "
                    "trial, as it stores Python state; where its batch depends on a value that differs between the "
                    "trials (a hyperparameter, or state of a trial that joined later), do that part in training_step "
                    "(which runs per trial), or train these trials in separate groups."
                )
        return results[0]

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Lightning's hook of the fused module: the trials' own."""
        return self.run("on_before_batch_transfer", batch, dataloader_idx)

    def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
        """Lightning's hook of the fused module: the trials' own."""
        return self.run("transfer_batch_to_device", batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Lightning's hook of the fused module: the trials' own."""
        return self.run("on_after_batch_transfer", batch, dataloader_idx)

    def _differing(self, hook: str, modules: list[Any], ids: list[int]) -> list[DifferingAttribute]:
        """What ``hook`` reads that differs between the trials (again after a slot change or the trials' code ran)."""
        key = (tuple(ids), state_generation())
        if self._checked.get(hook) == key:
            return []
        differing = hook_reads(modules, hook, ids=ids)
        if not differing:
            self._checked[hook] = key
        return differing
