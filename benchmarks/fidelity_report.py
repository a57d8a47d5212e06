"""Tables, plot and run comparison of ``benchmarks/fidelity.py`` (its raw results in, markdown and PNG out).

The statistics are ``lightning_hydro.scaling.rank_fidelity``'s: seed means, Spearman's rho against S = 1
with a bootstrap interval (configurations and seeds resampled; fixed bootstrap seed, so the same raw
results always give the same table), and the spread of the target's metric.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_hydro.scaling.rank_fidelity import (
    Interval,
    metric_spread,
    rank_fidelity,
    rank_fidelity_difference,
    seed_means,
)

PARAMETRIZATIONS = ("mup", "sp")
NAMES = {"mup": "muP", "sp": "standard"}
RESAMPLES = 2000


def _tasks(results: Mapping[str, Any]) -> list[str]:
    return [name for name in results if not name.startswith("_")]


def _ratios(task: Mapping[str, Any]) -> list[int]:
    return sorted(int(key.split("/")[1]) for key in task["runs"] if key.startswith("sp/"))


def analyse(results: Mapping[str, Any]) -> dict[str, Any]:
    """Per task: rho with its interval per (parametrization, S), muP - SP, best configurations, spreads."""
    analysis: dict[str, Any] = {}
    for name in _tasks(results):
        task = results[name]
        runs = task["runs"]
        rows = []
        for ratio in _ratios(task):
            row: dict[str, Any] = {"ratio": ratio, "width": task["full_width"] // ratio}
            for p in PARAMETRIZATIONS:
                reference, values = runs[f"{p}/1"]["values"], runs[f"{p}/{ratio}"]["values"]
                row[p] = rank_fidelity(reference, values, resamples=RESAMPLES) if ratio > 1 else Interval(1, 1, 1)
                row[f"{p}_best"] = _best(task["configurations"], values)
            if ratio > 1:
                row["difference"] = rank_fidelity_difference(
                    runs["mup/1"]["values"],
                    runs[f"mup/{ratio}"]["values"],
                    runs["sp/1"]["values"],
                    runs[f"sp/{ratio}"]["values"],
                    resamples=RESAMPLES,
                )
            rows.append(row)
        analysis[name] = {
            "rows": rows,
            "spread": {p: metric_spread(runs[f"{p}/1"]["values"]) for p in PARAMETRIZATIONS},
            "seeds": runs["sp/1"]["seeds"],
            "steps": task["steps"],
            "width_key": task["width_key"],
            "metric": task["metric"],
            "groups": {key: (run["backends"], sum(run["seconds"])) for key, run in runs.items()},
        }
    return analysis


def _best(configurations: Sequence[Mapping[str, Any]], values: Sequence[Sequence[float]]) -> str:
    means = seed_means(values)
    best = min(range(len(means)), key=lambda i: means[i])
    config = ", ".join(f"{k}={v:g}" for k, v in configurations[best].items())
    return f"{config} ({means[best]:.3f})"


def write_table(analysis: Mapping[str, Any], path: Path) -> None:
    """The fidelity table, the target's spread, and the groups' backends and times, as markdown."""
    first = next(iter(analysis.values()))
    lines = [
        f"Spearman's rho of the seed-mean final validation loss against S = 1 ({len(first['seeds'])} seeds: "
        f"{first['seeds']}), with 95% bootstrap intervals ({RESAMPLES} resamples of configurations and seeds); "
        "muP - SP is paired (same resampled configurations).",
        "",
        "| task | S | width | muP rho [95% CI] | SP rho [95% CI] | muP - SP [95% CI] | muP best (mean) "
        "| SP best (mean) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, task in analysis.items():
        for row in task["rows"]:
            difference = row["difference"].describe() if "difference" in row else "-"
            rhos = [row[p].describe() if row["ratio"] > 1 else "1 (target)" for p in PARAMETRIZATIONS]
            lines.append(
                f"| {name} | {row['ratio']} | {task['width_key']}={row['width']} | {rhos[0]} | {rhos[1]} | "
                f"{difference} | {row['mup_best']} | {row['sp_best']} |"
            )
    lines += [
        "",
        "Spread of the target's (S = 1) seed-mean metric: best to worst finite configuration, median standard "
        "deviation across seeds, share of configuration pairs whose order the seeds resolve (gap > 2 combined "
        "standard errors), diverged configurations.",
        "",
        "| task | parametrization | range | median seed std | pairs resolved | diverged |",
        "|---|---|---|---|---|---|",
    ]
    for name, task in analysis.items():
        for p in PARAMETRIZATIONS:
            s = task["spread"][p]
            lines.append(
                f"| {name} | {NAMES[p]} | {s['range']:.3f} | {s['seed_std']:.4f} | {s['resolved']:.0%} | "
                f"{int(s['diverged'])} |"
            )
    lines += [
        "",
        "Groups (one fused group per seed): backend each ran on, and seconds summed over seeds (wall time on a "
        "shared machine: not part of what reproduces).",
        "",
        "| task | group | backends | seconds |",
        "|---|---|---|---|",
    ]
    for name, task in analysis.items():
        for key, (backends, seconds) in task["groups"].items():
            lines.append(f"| {name} | {key.replace('/', ' S=')} | {', '.join(sorted(set(backends)))} | {seconds:.0f} |")
    path.write_text("\n".join(lines) + "\n")


def compare_runs(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Where two raw results differ in any per-seed value or backend (empty: identical)."""
    differences = []
    if _tasks(a) != _tasks(b):
        return [f"different tasks: {_tasks(a)} and {_tasks(b)}"]
    for name in _tasks(a):
        runs_a, runs_b = a[name]["runs"], b[name]["runs"]
        if sorted(runs_a) != sorted(runs_b):
            differences.append(f"{name}: different groups {sorted(runs_a)} and {sorted(runs_b)}")
            continue
        for key in runs_a:
            for field in ("values", "seeds", "backends"):
                if runs_a[key][field] != runs_b[key][field]:
                    differences.append(f"{name} {key}: {field} differ: {runs_a[key][field]} vs {runs_b[key][field]}")
    return differences


def plot(results: Mapping[str, Any], analysis: Mapping[str, Any], path: Path) -> None:
    """rho vs S with intervals, and each parametrization's loss vs learning rate (seed means) at every S."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(analysis)
    fig, axes = plt.subplots(len(names), 3, figsize=(15, 4.2 * len(names)), squeeze=False)
    for row, name in zip(axes, names):
        task, rows = results[name], analysis[name]["rows"]
        ratios = [r["ratio"] for r in rows]
        for offset, (p, marker) in zip((0.97, 1.03), zip(PARAMETRIZATIONS, "os")):
            rho = [r[p].rho for r in rows]
            errors = [[r[p].rho - r[p].low for r in rows], [r[p].high - r[p].rho for r in rows]]
            row[0].errorbar([x * offset for x in ratios], rho, yerr=errors, marker=marker, capsize=3, label=NAMES[p])
        row[0].axhline(0.9, color="grey", linestyle=":", linewidth=1)
        row[0].set_xscale("log", base=2)
        row[0].set_xticks(ratios, [str(r) for r in ratios])
        row[0].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        row[0].set(ylim=(-1.05, 1.05), xlabel="width divisor S", ylabel="Spearman vs S = 1 (95% CI)", title=name)
        row[0].legend()
        configurations = task["configurations"]
        lr_key, other_key = configurations[0]
        lrs = sorted({c[lr_key] for c in configurations})
        for col, p in zip(row[1:], PARAMETRIZATIONS):
            for ratio in ratios:
                means = seed_means(task["runs"][f"{p}/{ratio}"]["values"])
                best = [
                    min(
                        (m for m, c in zip(means, configurations) if c[lr_key] == lr and math.isfinite(m)),
                        default=math.nan,
                    )
                    for lr in lrs
                ]
                col.plot(lrs, best, marker="o", label=f"S = {ratio}")
            col.set(
                xscale="log",
                xlabel=lr_key,
                ylabel=f"{task['metric']} (seed mean, best over {other_key})",
                title=f"{name}: {NAMES[p]}",
            )
            col.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
