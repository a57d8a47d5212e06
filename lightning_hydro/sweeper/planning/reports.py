"""The results of a sweep: one record per trial, ``results.json``, ``results.csv`` and a table of the best.

A record holds everything about a trial: its id, group and job directory, the backend its group ran on,
its parameters and override lines, its status, budget (epochs trained), final metrics and per-epoch history.

Example::

    >>> records = [
    ...     {"trial_id": 0, "status": "completed",
    ...      "budget": 2, "params": {"lr": 0.1}, "metrics": {"acc": 0.8}},
    ...     {"trial_id": 1, "status": "stopped",
    ...      "budget": 1, "params": {"lr": 0.9}, "metrics": {"acc": 0.9}},
    ... ]
    >>> [r["trial_id"] for r in rank_trials(records, "acc", "max")]
    [1, 0]
    >>> print(format_best_table(records, "acc", "max", top=1))
    Best 1 of 2 trials by acc (max):
    rank  trial  status   budget     acc   lr
       1      1  stopped       1  0.9000  0.9
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_hydro.sweeper.json_files import write_json_atomic

__all__ = ["format_best_table", "metric_value", "rank_trials", "write_results"]

Record = dict[str, Any]


def metric_value(record: Record, metric: str) -> float | None:
    """The trial's final ``metric``, or ``None`` if it was not logged or is not finite."""
    value = record.get("metrics", {}).get(metric)
    return float(value) if value is not None and math.isfinite(value) else None


def rank_trials(records: Sequence[Record], metric: str, mode: str) -> list[Record]:
    """Trials with a finite ``metric``, best first (ties: lower trial id first)."""
    scored = [(metric_value(r, metric), r) for r in records]
    ranked = [(v, r) for v, r in scored if v is not None]
    ranked.sort(key=lambda vr: ((-vr[0] if mode == "max" else vr[0]), vr[1]["trial_id"]))
    return [r for _, r in ranked]


def write_results(
    sweep_dir: Path, records: Sequence[Record], retrained: Sequence[Record], *, metric: str, mode: str
) -> tuple[Path, Path]:
    """Write ``results.json`` (everything) and ``results.csv`` (one row per trial) into ``sweep_dir``."""
    ranked = rank_trials(records, metric, mode)
    json_path, csv_path = sweep_dir / "results.json", sweep_dir / "results.csv"
    write_json_atomic(
        json_path,
        {
            "metric": metric,
            "mode": mode,
            "n_trials": len(records),
            "best": ranked[0] if ranked else None,
            "trials": list(records),
            "retrain": list(retrained),
        },
    )
    params = _union_keys(r.get("params", {}) for r in records)
    metrics = _union_keys(r.get("metrics", {}) for r in records)
    columns = ["trial_id", "group", "backend", "status", "budget", *params, *metrics, "job_dir", "overrides"]
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for r in records:
            writer.writerow(
                [r.get("trial_id"), r.get("group"), r.get("backend", ""), r.get("status"), r.get("budget")]
                + [r.get("params", {}).get(k) for k in params]
                + [r.get("metrics", {}).get(k) for k in metrics]
                + [r.get("job_dir"), " ".join(r.get("overrides", []))]
            )
    return json_path, csv_path


def format_best_table(records: Sequence[Record], metric: str, mode: str, *, top: int = 10) -> str:
    """A plain-text table of the ``top`` best trials by ``metric``."""
    ranked = rank_trials(records, metric, mode)[:top]
    if not ranked:
        logged = sorted(_union_keys(r.get("metrics", {}) for r in records))
        if not logged:  # no trial has any result: their groups failed (the errors are logged) or did not run
            counts = Counter(str(r.get("status")) for r in records)
            statuses = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
            return f"No trial has a {metric!r} to rank: no trial has results ({statuses}; failed groups: see above)."
        return (
            f"No trial logged a finite {metric!r} (logged metrics: {logged}); set hydra.sweeper.metric to one of them."
        )
    params = _union_keys(r.get("params", {}) for r in ranked)
    header = ["rank", "trial", "status", "budget", metric, *params]
    rows = [
        [str(i + 1), str(r["trial_id"]), r["status"], str(r["budget"]), f"{metric_value(r, metric):.4f}"]
        + [_short(r.get("params", {}).get(k)) for k in params]
        for i, r in enumerate(ranked)
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    align_left = {2}
    lines = [f"Best {len(ranked)} of {len(records)} trials by {metric} ({mode}):"]
    for row in [header, *rows]:
        cells = [c.ljust(w) if i in align_left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _union_keys(dicts: Any) -> list[str]:
    keys: dict[str, None] = {}
    for d in dicts:
        keys.update(dict.fromkeys(d))
    return list(keys)
