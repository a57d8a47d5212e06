"""Per-trial results of a fused run: status, budget used, metrics, and the table printed at the end of fit.

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
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["TrialRecord", "TrialStatus", "best_trial", "format_results_table"]

TrialStatus = Literal["running", "completed", "stopped", "diverged"]
TRIAL_STATUSES: tuple[TrialStatus, ...] = ("running", "completed", "stopped", "diverged")


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
    """

    trial_id: int
    status: TrialStatus = "running"
    epochs: int = 0
    steps: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    history: list[dict[str, float]] = field(default_factory=list)
    backend: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The public form used by ``FusedLightningModule.results`` (``budget`` is the epochs trained)."""
        out = asdict(self)
        del out["trial_id"]
        out["budget"] = self.epochs
        return out

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
