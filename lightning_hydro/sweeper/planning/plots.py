"""Plots of a sweep (matplotlib, Agg backend): learning curves by status, and the metric vs each parameter.

Example::

    >>> import tempfile
    >>> from pathlib import Path
    >>> history = [{"epoch": 0, "val_acc": 0.5}, {"epoch": 1, "val_acc": 0.8}]
    >>> records = [{"trial_id": 0, "status": "completed", "params": {"model.lr": 0.1},
    ...             "metrics": {"val_acc": 0.8}, "history": history}]
    >>> out = Path(tempfile.mkdtemp())
    >>> [p.name for p in plot_sweep(records, "val_acc", out, log_scale_keys={"model.lr"})]
    ['learning_curves.png', 'metric_vs_params.png']
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

__all__ = ["STATUS_COLORS", "plot_in_background", "plot_sweep"]

STATUS_COLORS = {
    "completed": "tab:green",
    "stopped": "tab:orange",
    "diverged": "tab:red",
    "running": "tab:blue",
    "failed": "tab:gray",
}


def plot_sweep(
    records: Sequence[dict[str, Any]], metric: str, out_dir: Path, *, log_scale_keys: Collection[str] = ()
) -> list[Path]:
    """Draw ``learning_curves.png`` and ``metric_vs_params.png`` into ``out_dir``; return the files written.

    Args:
        records: trial records (``status``, ``params``, ``metrics``, ``history``).
        metric: the metric to plot.
        out_dir: where the images go (created if needed).
        log_scale_keys: parameters drawn on a log axis (those sampled with ``tag(log, ...)``).

    Raises:
        ImportError: if matplotlib is not installed.
    """
    try:
        import matplotlib
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("plot_sweep needs matplotlib: pip install matplotlib") from err

    matplotlib.use("Agg")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [_learning_curves(records, metric, out_dir / "learning_curves.png")]
    params = list(dict.fromkeys(k for r in records for k in r.get("params", {})))
    if params:
        written.append(_metric_vs_params(records, metric, params, log_scale_keys, out_dir / "metric_vs_params.png"))
    return written


def _learning_curves(records: Sequence[dict[str, Any]], metric: str, path: Path) -> Path:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4.5))
    seen: set[str] = set()
    for r in records:
        points = [(row["epoch"], row[metric]) for row in r.get("history", []) if metric in row]
        if not points:
            continue
        status = r.get("status", "failed")
        label = status if status not in seen else None
        seen.add(status)
        xs, ys = zip(*points)
        color = STATUS_COLORS.get(status, "black")
        ax.plot([x + 1 for x in xs], ys, color=color, alpha=0.7, lw=1.2, marker=".", label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} per trial, coloured by status")
    if seen:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _metric_vs_params(
    records: Sequence[dict[str, Any]], metric: str, params: list[str], log_keys: Collection[str], path: Path
) -> Path:
    import matplotlib.pyplot as plt

    cols = min(3, len(params))
    rows = math.ceil(len(params) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.5 * rows), squeeze=False)
    for ax, key in zip(axes.flat, params):
        points = [
            (r["params"][key], r["metrics"][metric], r.get("status", "failed"))
            for r in records
            if key in r.get("params", {}) and metric in r.get("metrics", {})
        ]
        numeric = all(isinstance(x, int | float) and not isinstance(x, bool) for x, _, _ in points)
        labels: list[str] = sorted({str(x) for x, _, _ in points}) if not numeric else []
        for x, y, status in points:
            xpos = x if numeric else labels.index(str(x))
            ax.scatter(xpos, y, color=STATUS_COLORS.get(status, "black"), s=18)
        if not numeric:
            ax.set_xticks(range(len(labels)), labels)
        elif key in log_keys:
            ax.set_xscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(metric)
    for ax in list(axes.flat)[len(params) :]:
        ax.set_visible(False)
    fig.suptitle(f"final {metric} vs each hyperparameter")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_in_background(
    results_json: Path, out_dir: Path, *, log_scale_keys: Collection[str] = ()
) -> subprocess.Popen[bytes]:
    """Draw the plots of a sweep's ``results.json`` in a separate process, which the sweep does not wait for.

    Importing matplotlib and drawing take about a second and a half; the sweep returns meanwhile. The images
    appear in ``out_dir`` when the process ends (its errors go to ``out_dir/plot_error.txt``).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    # this file run as a script: importing the package would import torch and Lightning, for nothing
    command = [sys.executable, str(Path(__file__)), str(results_json), str(out_dir), *sorted(log_scale_keys)]
    with (out_dir / "plot_error.txt").open("wb") as errors:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True)


def _main(argv: Sequence[str]) -> None:
    results_json, out_dir, *log_keys = argv
    results = json.loads(Path(results_json).read_text(encoding="utf-8"))
    plot_sweep(results["trials"], results["metric"], Path(out_dir), log_scale_keys=set(log_keys))
    error_file = Path(out_dir) / "plot_error.txt"
    if error_file.is_file() and not error_file.stat().st_size:
        error_file.unlink()


if __name__ == "__main__":
    _main(sys.argv[1:])
