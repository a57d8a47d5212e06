"""One vocabulary for a trial: its status, its record, its results, and the table printed at the end of a fit.

The fused module keeps a :class:`TrialRecord` per trial and hands out :class:`TrialResult` dicts
(``FusedLightningModule.results``); the callbacks end trials with a :class:`TrialStatus`; the sweeper writes
the same dicts per trial. Pure Python: no torch, no Lightning.

Example::

    >>> records = {0: TrialRecord(0, epochs=3, metrics={"val_acc": 0.91}),
    ...            1: TrialRecord(1, status="stopped", epochs=1, metrics={"val_acc": 0.42}, reason="ASHA rung 0")}
    >>> print(format_results_table(records, monitor="val_acc", mode="max"))
    trial  status   epochs  steps  val_acc  note
    0      running  3       0      0.9100   best
    1      stopped  1       0      0.4200   ASHA rung 0
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

__all__ = ["TimeAttr", "TrialRecord", "TrialResult", "TrialStatus", "best_trial", "format_results_table"]

TrialStatus = Literal["running", "completed", "stopped", "diverged", "failed"]
"""``running``: in a slot (or interrupted); ``completed``: trained to the end (``max_t``); ``stopped``: ended early
by a decision, a deadline or the end of fit; ``diverged``: non-finite loss, gradients or monitored value;
``failed``: a sweep could not build or train it (the sweeper records the error)."""

TRIAL_STATUSES: tuple[TrialStatus, ...] = ("running", "completed", "stopped", "diverged", "failed")
ENDED_STATUSES: tuple[TrialStatus, ...] = ("completed", "stopped", "diverged")
"""The statuses a trial can leave its slot with."""

TimeAttr = Literal["epochs", "steps"]
"""What a budget counts: training epochs, or optimizer steps."""


class TrialResult(TypedDict):
    """One trial's results: ``FusedLightningModule.results[trial_id]``, and a sweep's per-trial result.

    Attributes:
        status: See :data:`TrialStatus`.
        budget: What the trial trained, in ``budget_unit``.
        budget_unit: ``"epochs"``, or ``"steps"`` when an early-stopping callback counts steps.
        epochs: Training epochs completed since the trial entered its slot.
        steps: Optimizer steps taken.
        metrics: The latest value of everything it logged (epoch values where there are any).
        reason: Why it ended, if it did.
        history: One dict of epoch metrics per epoch (``{"epoch": e, name: value, ...}``): the learning curve.
        backend: The backend its group trained on (``""`` for an unfused run); absent for a trial that failed
            before training.
        error: Why a ``failed`` trial failed (the exception's type and message).
    """

    status: TrialStatus
    budget: int
    budget_unit: NotRequired[TimeAttr]
    epochs: NotRequired[int]
    steps: NotRequired[int]
    metrics: dict[str, float]
    reason: NotRequired[str]
    history: list[dict[str, float]]
    backend: NotRequired[str]
    error: NotRequired[str]


@dataclass
class TrialRecord:
    """What is known about one trial.

    Attributes:
        trial_id: the trial's id in its group.
        status: ``running`` (in a slot), ``completed`` (trained to the end), ``stopped`` (by a decision)
            or ``diverged`` (non-finite loss or gradients).
        epochs: training epochs completed since the trial entered its slot: its budget.
        steps: optimizer steps taken.
        metrics: the last value of everything it logged (epoch values where there are any).
        reason: why it stopped, if it did.
        history: one dict of epoch metrics per completed epoch (``{"epoch": e, name: value, ...}``).
        backend: the backend its group trains on (``"vmap"``, ``"hfta"`` or ``"loop"``; what ``backend="auto"``
            chose, which ``backend=`` pins in a rerun); ``""`` until the choice is made.
        budget_unit: what its budget counts (an early-stopping callback that counts steps sets ``"steps"``).
    """

    trial_id: int
    status: TrialStatus = "running"
    epochs: int = 0
    steps: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    history: list[dict[str, float]] = field(default_factory=list)
    backend: str = ""
    budget_unit: TimeAttr = "epochs"

    @property
    def budget(self) -> int:
        """What the trial trained, in :attr:`budget_unit`."""
        return self.epochs if self.budget_unit == "epochs" else self.steps

    def as_dict(self) -> TrialResult:
        """The public form used by ``FusedLightningModule.results`` (``budget`` in ``budget_unit``)."""
        return TrialResult(
            status=self.status,
            budget=self.budget,
            budget_unit=self.budget_unit,
            epochs=self.epochs,
            steps=self.steps,
            metrics=dict(self.metrics),
            reason=self.reason,
            history=[dict(entry) for entry in self.history],
            backend=self.backend,
        )

    @classmethod
    def from_dict(cls, trial_id: int, data: Mapping[str, Any]) -> TrialRecord:
        """Inverse of :meth:`as_dict` (used when a checkpoint is restored)."""
        return cls(
            trial_id=trial_id,
            status=data["status"],
            epochs=int(data["epochs"]),
            steps=int(data["steps"]),
            metrics=dict(data["metrics"]),
            reason=str(data.get("reason", "")),
            history=[dict(h) for h in data.get("history", [])],
            backend=str(data.get("backend", "")),
            budget_unit=data.get("budget_unit", "epochs"),
        )


def best_trial(records: Mapping[int, TrialRecord], monitor: str, mode: Literal["min", "max"]) -> int | None:
    """The id of the trial with the best finite ``monitor`` value, or None if no trial logged it."""
    scored = [
        (r.metrics[monitor], tid)
        for tid, r in records.items()
        if monitor in r.metrics and math.isfinite(r.metrics[monitor])
    ]
    if not scored:
        return None
    return (min(scored) if mode == "min" else max(scored, key=lambda pair: (pair[0], -pair[1])))[1]


def _metric_columns(records: Mapping[int, TrialRecord], monitor: str | None, limit: int) -> list[str]:
    names = sorted({name for r in records.values() for name in r.metrics})
    # validation metrics first: they are what a sweep selects on
    names.sort(key=lambda n: (n != monitor, not n.startswith("val"), n))
    return names[:limit]


def format_results_table(
    records: Mapping[int, TrialRecord],
    *,
    monitor: str | None = None,
    mode: Literal["min", "max"] = "min",
    max_metric_columns: int = 4,
) -> str:
    """A plain-text table of the trials: id, status, budget and up to ``max_metric_columns`` metrics."""
    columns = _metric_columns(records, monitor, max_metric_columns)
    best = best_trial(records, monitor, mode) if monitor else None
    header = ["trial", "status", "epochs", "steps", *columns, "note"]
    rows = [header]
    for tid in sorted(records):
        r = records[tid]
        values = [f"{r.metrics[c]:.4f}" if c in r.metrics else "-" for c in columns]
        note = "best" if tid == best else r.reason
        rows.append([str(tid), r.status, str(r.epochs), str(r.steps), *values, note])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)
