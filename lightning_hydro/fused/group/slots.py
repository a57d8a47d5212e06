"""``TrialSlots``: the slots of a fused group, and stop / add as one operation each.

A fused group has ``max_slots`` slots; each running trial holds one row of the stacked state. Stopping a
trial must, in one go, move the fused optimizer state into the trials' own optimizers, drop the row from every
stacked tensor (compaction), retire the trial's module with its last weights, close its record, and hand the
optimizer the new rows; adding one appends a row with a fresh module and a fresh optimizer. Doing these in
one place keeps the invariants (rows, records and optimizer state always describe the same trials) where
they can be tested without a Trainer. What the rest of the group and Lightning must hear of a slot change
(metrics, health, LR scheduler configs) is :mod:`lightning_hydro.fused.roster`'s business; the fused module
ends the fit from its own hooks once no trial runs.

Example::

    >>> from torch import nn
    >>> from lightning_hydro.demos import DigitsMLP
    >>> slots = TrialSlots(nn.Module(), [DigitsMLP(hidden_dim=8) for _ in range(3)], [0, 1, 2], max_slots=3)
    >>> retired = slots.stop(1, "stopped", "a decision")
    >>> slots.trial_ids, slots.free, slots.book.records[1].status
    ([0, 2], 1, 'stopped')
    >>> slots.add(DigitsMLP(hidden_dim=8), None)
    3
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from lightning_hydro.fused.group.book import TrialBook
from lightning_hydro.optim.group_optimizer import TrialGroupOptimizer
from lightning_hydro.optim.optimizer_config import TrialOptimization
from lightning_hydro.stacking.stacked_state import StackedState
from lightning_hydro.stopping.trial_record import ENDED_STATUSES, TrialStatus

__all__ = ["TrialSlots"]


class TrialSlots:
    """Which trial holds each row, every trial's record, the retired modules; stop and add.

    Args:
        storage: the module the stacked tensors are registered on.
        modules: the initial trial modules (one architecture).
        trial_ids: one id per module.
        max_slots: how many trials the group may hold at once.
        pad_widths: trials may differ in hidden sizes (zero-padded; see :class:`StackedState`).
    """

    def __init__(
        self,
        storage: nn.Module,
        modules: Sequence[nn.Module],
        trial_ids: Sequence[int],
        max_slots: int,
        *,
        pad_widths: bool = False,
    ) -> None:
        self.storage = storage
        self.group = StackedState(storage, modules, trial_ids, pad_widths=pad_widths)
        self.book = TrialBook(trial_ids)
        self.retired: dict[int, nn.Module] = {}
        self.max_slots = max_slots
        self.optimizer: TrialGroupOptimizer | None = None  # set once Lightning has asked for optimizers

    @property
    def trial_ids(self) -> list[int]:
        """The running trials, in row order."""
        return self.group.trial_ids

    @property
    def free(self) -> int:
        """Free slots."""
        return self.max_slots - self.group.size

    def module(self, trial_id: int) -> nn.Module:
        """A trial's module: bound to its row while it runs, standalone once retired."""
        if trial_id in self.group.trial_ids:
            return self.group.modules[self.group.row_of(trial_id)]
        if trial_id in self.retired:
            return self.retired[trial_id]
        raise KeyError(f"No trial {trial_id}; known trials: {sorted(self.book.records)}.")

    def running(self) -> list[tuple[int, nn.Module]]:
        """``(id, module)`` of every running trial, in row order."""
        return list(zip(self.group.trial_ids, self.group.modules))

    def use_optimizer(self, optimizer: TrialGroupOptimizer) -> None:
        """Keep the group optimizer Lightning was given in step with :meth:`stop` and :meth:`add` from now on."""
        self.optimizer = optimizer

    def check_stop(self, trial_id: int, status: TrialStatus) -> None:
        """Raise the error :meth:`stop` would raise for these arguments, if any (callers check before they act)."""
        if status not in ENDED_STATUSES:
            raise ValueError(f"stop_trial: status must be 'stopped', 'completed' or 'diverged', got {status!r}.")
        if trial_id not in self.group.trial_ids:
            raise KeyError(f"stop_trial: trial {trial_id} is not running; running trials: {self.group.trial_ids}.")

    def stop(self, trial_id: int, status: TrialStatus, reason: str) -> nn.Module:
        """Compact the trial out of the group; its optimizer state is dropped, the others keep theirs.

        Returns:
            The retired module (it owns a copy of its last weights).

        Raises:
            ValueError: for a status other than stopped / completed / diverged.
            KeyError: if the trial is not running.
        """
        self.check_stop(trial_id, status)
        if self.optimizer is not None:
            self.optimizer.materialize()  # fused state back into each trial's optimizer before the rows change
        (module,) = self.group.remove([self.group.row_of(trial_id)])
        self.retired[trial_id] = module
        self.book.finish(trial_id, status, reason)
        if self.optimizer is not None:
            self.optimizer.remove_trial(trial_id)
        return module

    def check_newcomer(self, module: nn.Module) -> None:
        """Raise the error :meth:`add` raises for a module already in the group (callers check before they act)."""
        if any(module is m for m in self.group.modules):
            raise ValueError("add_trial: this module is already in the group.")

    def new_id(self, trial_id: int | None) -> int:
        """The id a newcomer gets (checked: unused).

        Raises:
            RuntimeError: if no slot is free.
            ValueError: if the id is already used.
        """
        if self.free <= 0:
            raise RuntimeError(
                f"add_trial: all {self.max_slots} slots are taken; stop a trial first or create the group with "
                "a larger max_slots."
            )
        tid = self.book.next_id() if trial_id is None else int(trial_id)
        if tid in self.book:
            raise ValueError(f"add_trial: trial id {tid} is already used; known ids: {sorted(self.book.records)}.")
        return tid

    def add(self, module: nn.Module, trial_id: int | None, optimization: TrialOptimization | None = None) -> int:
        """Append the module as a new row with a fresh record (and, once optimizers exist, ``optimization``).

        Returns:
            The trial's id.
        """
        self.check_newcomer(module)
        tid = self.new_id(trial_id)
        if self.optimizer is not None:
            self.optimizer.materialize()
        self.group.append(module, tid)
        self.book.add(tid)
        if self.optimizer is not None:
            if optimization is None:
                raise ValueError("TrialSlots.add: the group has optimizers; pass the newcomer's optimization.")
            self.optimizer.add_trial(tid, optimization)
        return tid

    def replace(self, known: dict[int, nn.Module], live: Sequence[int]) -> None:
        """Hold ``live`` (ids of ``known`` modules) in new stacked state; the rest of ``known`` is retired.

        With no ``live`` trial (a checkpoint written after every trial ended, restored for evaluation) the group
        is empty: its stacked tensors keep the trials' shapes with no rows, as in the run that wrote it.
        """
        for module in self.group.modules:
            self.group.detach(module)
        padded = self.group.pad_widths
        rows = list(live) or sorted(known)  # an empty StackedState is one whose every row was removed
        self.group = StackedState(self.storage, [known[tid] for tid in rows], rows, pad_widths=padded)
        if not live:
            self.group.reorder([])
        self.retired = {tid: m for tid, m in known.items() if tid not in live}
