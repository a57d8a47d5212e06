"""``TrialBook``: what is known about every trial a fused group has held, and the current epoch's tally.

Pure Python (no torch, no Lightning), so that its rules are easy to read and test: a trial's budget is
the number of training epochs it trained *through* since it entered its slot (credited when the epoch's
training batches end, before validation, so decisions taken after validation see it); its history has
one entry per epoch it took part in.

Example::

    >>> book = TrialBook([0, 1])
    >>> book.start_epoch(live=[0, 1])
    >>> book.record_metrics(1, {"val_acc": 0.5})
    >>> book.count_epoch(live=[1])          # trial 0 stopped mid-epoch: no credit
    >>> book.end_epoch(0, live=[1])
    >>> book.records[1].epochs, book.records[0].epochs, book.records[1].history
    (1, 0, [{'epoch': 0.0, 'val_acc': 0.5}])
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from lightning_hydro.stopping.trial_record import TRIAL_STATUSES, TimeAttr, TrialRecord, TrialResult, TrialStatus

__all__ = ["TrialBook"]


class TrialBook:
    """Records of every trial (by id), and which of them are in the current epoch.

    Args:
        trial_ids: the group's initial trials.
    """

    def __init__(self, trial_ids: Iterable[int]) -> None:
        self.records: dict[int, TrialRecord] = {tid: TrialRecord(tid) for tid in trial_ids}
        self._epoch_ids: set[int] = set()
        self._counted: set[int] = set()
        self._epoch_metrics: dict[int, dict[str, float]] = {}
        self._epoch: int | None = None  # the open epoch's index (None before the first)
        self._ended = False  # its history entries are written
        self._unit: TimeAttr = "epochs"
        self.changes = 0  # counts changes of the records' statuses (a reader may keep what it derived until then)

    def __contains__(self, trial_id: int) -> bool:
        return trial_id in self.records

    def add(self, trial_id: int) -> None:
        """Open a record for a trial that joins the group."""
        self.records[trial_id] = TrialRecord(trial_id, budget_unit=self._unit)
        self.changes += 1

    def count_budget_in(self, unit: TimeAttr) -> None:
        """Every record's budget (those of trials still to come included) counts ``unit``."""
        self._unit = unit
        for record in self.records.values():
            record.budget_unit = unit

    def next_id(self) -> int:
        """The smallest id above every known one."""
        return max(self.records, default=-1) + 1

    def start_epoch(self, live: Iterable[int], epoch: int = 0) -> None:
        """A training epoch starts with these trials running."""
        self._epoch_ids = set(live)
        self._counted = set()
        self._epoch_metrics = {}
        self._epoch, self._ended = epoch, False

    def resume_epoch(self, epoch: int, live: Iterable[int]) -> None:
        """Training (re)starts in ``epoch``, perhaps in its middle, where Lightning calls no ``on_train_epoch_start``.

        The open epoch goes on if it is ``epoch`` (a checkpoint written mid-epoch). Otherwise it is closed, if
        its end was never reached (Lightning resumes a checkpoint written after an epoch's last batch in the next
        epoch, without that epoch's validation or end), and ``epoch`` is opened.
        """
        live = list(live)
        if self._epoch == epoch:
            return
        if self._epoch is not None and not self._ended:
            self.end_epoch(self._epoch, live)
        self.start_epoch(live, epoch)

    def count_epoch(self, live: Iterable[int]) -> None:
        """The epoch's training batches are done: credit it to every trial that trained through all of it."""
        running = set(live)
        for tid in self._epoch_ids - self._counted:
            if tid in running:
                self.records[tid].epochs += 1
        self._counted |= self._epoch_ids

    def record_metrics(self, trial_id: int, metrics: Mapping[str, float]) -> None:
        """Epoch values of a trial: its latest metrics, and this epoch's history entry."""
        self.records[trial_id].metrics.update(metrics)
        self._epoch_metrics.setdefault(trial_id, {}).update(metrics)

    def update_metrics(self, trial_id: int, metrics: Mapping[str, float]) -> None:
        """Latest values only (e.g. the last step value of a step-level metric)."""
        self.records[trial_id].metrics.update(metrics)

    def add_steps(self, trial_id: int, steps: int) -> None:
        """The trial took ``steps`` more optimizer steps (counted on the device, read back now)."""
        self.records[trial_id].steps += steps

    def end_epoch(self, epoch: int, live: Iterable[int]) -> None:
        """Close the epoch: credit it (if not yet done) and append every participant's history entry."""
        self.count_epoch(live)
        for tid in sorted(self._epoch_ids):
            self.records[tid].history.append({"epoch": float(epoch), **self._epoch_metrics.get(tid, {})})
        self._ended = True

    def finish(self, trial_id: int, status: TrialStatus, reason: str = "") -> None:
        """A trial leaves its slot with this status."""
        record = self.records[trial_id]
        record.status, record.reason = status, reason
        self.changes += 1

    def set_status(self, trial_ids: Iterable[int], status: TrialStatus) -> None:
        """Mark trials (e.g. the running ones at the start or the end of a fit)."""
        for tid in trial_ids:
            self.records[tid].status = status
        self.changes += 1

    def set_backend(self, trial_ids: Iterable[int], backend: str) -> None:
        """These trials train on ``backend`` (recorded in their results)."""
        for tid in trial_ids:
            self.records[tid].backend = backend

    def counts(self) -> dict[str, int]:
        """How many trials have each status."""
        counts: dict[str, int] = dict.fromkeys(TRIAL_STATUSES, 0)
        for record in self.records.values():
            counts[record.status] += 1
        return counts

    def results(self) -> dict[int, TrialResult]:
        """Every record in its public form, by id."""
        return {tid: record.as_dict() for tid, record in sorted(self.records.items())}

    def load(self, results: Mapping[int, Mapping[str, Any]]) -> None:
        """Replace the records with those of :meth:`results` (a checkpoint)."""
        self.records = {tid: TrialRecord.from_dict(tid, data) for tid, data in results.items()}
        self.changes += 1

    def epoch_state(self) -> dict[str, Any]:
        """The current epoch's tally, for a checkpoint: a run resumed mid-epoch gets no ``start_epoch`` call."""
        return {
            "epoch": self._epoch,
            "ended": self._ended,
            "trial_ids": sorted(self._epoch_ids),
            "counted": sorted(self._counted),
            "metrics": {tid: dict(values) for tid, values in self._epoch_metrics.items()},
        }

    def load_epoch_state(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`epoch_state`."""
        self._epoch = None if state["epoch"] is None else int(state["epoch"])
        self._ended = bool(state["ended"])
        self._epoch_ids = {int(tid) for tid in state["trial_ids"]}
        self._counted = {int(tid) for tid in state["counted"]}
        self._epoch_metrics = {int(tid): dict(values) for tid, values in state["metrics"].items()}

    def settled(self, steps: Mapping[int, int], live: Iterable[int], *, epoch_done: bool) -> TrialBook:
        """A copy with pending bookkeeping applied: steps not yet read back and, after an epoch's last batch, the epoch.

        A checkpoint written by a callback's ``on_train_batch_end`` runs before the module's own hook credits
        the batch; Lightning does not run that batch's hooks again on resume, so the checkpoint must hold the
        settled counts.
        """
        book = copy.deepcopy(self)
        for tid, count in steps.items():
            book.add_steps(tid, count)
        if epoch_done:
            book.count_epoch(live)
        return book
