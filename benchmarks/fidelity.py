"""Fidelity of muP surrogates: does a width / S model rank hyperparameters as the full-size model does?

For each task, 16 configurations (4 learning rates x 4 values of a second hyperparameter) are trained at
width / S for S = 1, 2, 4, 8, once under muP (``Surrogate.build``) and once in standard parametrization
(the same model class built at width / S, nothing else changed). For every S the final validation losses
are ranked and compared with the S = 1 ranking of the same parametrization (Spearman's rho). Goal: muP's
rho >= 0.85 at S = 4 on both tasks, and above standard parametrization's.

Tasks: (a) ``DigitsMLP`` on scikit-learn's digits (SGD: lr x momentum); (b) ``CharTransformer`` on the
standard library's source (AdamW with linear warm-up: lr x warmup_steps).

Run (about 8 minutes on an idle 2-core machine, one process per parametrization; ``--quick`` for a smoke
test; ``--from-json docs/scaling_fidelity.json`` redraws the table and plot without training)::

    PYTHONPATH=. python benchmarks/fidelity.py

It writes docs/scaling_fidelity.md (table), docs/scaling_fidelity.png (plot), the coordinate check
(docs/scaling_coord_check.md and one plot per task), and the raw numbers to benchmarks/results/fidelity.json
(copied by hand to docs/scaling_fidelity.json when the docs are updated).

All configurations of one (task, S, parametrization) go through ``train_configurations``: today a lean
loop training them one after another; it is the one function to switch to ``FusedLightningModule``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos.char_lm import CharDataModule, CharTransformer
from lightning_hydro.demos.digits import DigitsDataModule, DigitsMLP
from lightning_hydro.scaling import CoordCheck, Surrogate, coord_check, plot_coord_checks

ROOT = Path(__file__).resolve().parents[1]
RATIOS = (1, 2, 4, 8)
# Coordinate check per task: widths, layers plotted, learning rate (Adam / AdamW).
COORD_CHECK = {
    "digits": ([64, 128, 256, 512, 1024], ["body.0", "body.1", "body.2", "body.3", "head"], 1e-3),
    "char_lm": (
        [32, 64, 128, 256],
        ["tokens", "blocks.0.qkv", "blocks.0.mlp", "blocks.0", "blocks.1", "norm", "head"],
        3e-3,
    ),
}
PARAMETRIZATIONS = ("mup", "sp")


@dataclass(frozen=True)
class Task:
    name: str
    factory: Callable[..., L.LightningModule]
    width_key: str
    full_width: int
    fixed: dict[str, Any]
    grid: dict[str, Sequence[Any]]  # exactly two hyperparameters, the first is the learning rate
    steps: int
    datamodule: Callable[[], L.LightningDataModule]
    metric: str = "val_loss"
    seed: int = 0
    configurations: list[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        (a, values_a), (b, values_b) = self.grid.items()
        configs = [{a: x, b: y} for x, y in itertools.product(values_a, values_b)]
        object.__setattr__(self, "configurations", configs)


def tasks(quick: bool) -> list[Task]:
    return [
        Task(
            name="digits",
            factory=DigitsMLP,
            width_key="hidden_dim",
            full_width=512,
            fixed={"depth": 2, "optimizer": "sgd"},
            grid={"lr": [0.03, 0.1, 0.3, 1.0], "momentum": [0.0, 0.5, 0.8, 0.9]},
            steps=60 if quick else 300,
            datamodule=lambda: DigitsDataModule(batch_size=64),
        ),
        Task(
            name="char_lm",
            factory=CharTransformer,
            width_key="d_model",
            full_width=128,
            fixed={"n_layers": 2, "n_heads": 4, "block_size": 64},
            grid={"lr": [1e-3, 3e-3, 1e-2, 3e-2], "warmup_steps": [1, 10, 30, 100]},
            steps=30 if quick else 150,
            datamodule=lambda: CharDataModule(block_size=64, batch_size=16),
        ),
    ]


def build_trials(task: Task, ratio: int, parametrization: str) -> list[L.LightningModule]:
    """One model per configuration at width / ratio; every one starts from the same seed."""
    surrogate = Surrogate(task.factory, width=[task.width_key])
    trials = []
    for config in task.configurations:
        torch.manual_seed(task.seed)
        if parametrization == "mup":
            model = surrogate.build(ratio=ratio, **task.fixed, **config, **{task.width_key: task.full_width})
        else:
            model = task.factory(**task.fixed, **config, **{task.width_key: task.full_width // ratio})
        trials.append(model)
    return trials


def train_configurations(
    models: Sequence[L.LightningModule], datamodule: L.LightningDataModule, steps: int, metric: str
) -> list[float]:
    """Train every model for ``steps`` steps, fused in one ``FusedLightningModule``; return each final ``metric``.

    All configurations see the same batches (one data pipeline for the group). A configuration that
    diverges is stopped by the fused module and scores ``inf``.
    """
    quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    torch.manual_seed(0)
    fused = FusedLightningModule(list(models), backend="auto", summary=False)
    trainer = L.Trainer(max_steps=steps, limit_val_batches=0, num_sanity_val_steps=0, **quiet)
    trainer.fit(fused, datamodule=datamodule)
    validated = L.Trainer(**quiet).validate(fused, datamodule=datamodule, verbose=False)[0] if fused.trial_ids else {}
    return [float(validated.get(f"{metric}/trial_{tid}", math.inf)) for tid in range(len(models))]


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho with average ranks for ties; a diverged (non-finite) run ranks last."""
    return _pearson(_ranks(a), _ranks(b))


def _ranks(values: Sequence[float]) -> list[float]:
    keyed = [v if math.isfinite(v) else math.inf for v in values]
    order = sorted(range(len(keyed)), key=lambda i: keyed[i])
    ranks = [0.0] * len(keyed)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and keyed[order[end + 1]] == keyed[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2.0
        start = end + 1
    return ranks


def _pearson(x: Sequence[float], y: Sequence[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sx = math.sqrt(sum((a - mx) ** 2 for a in x))
    sy = math.sqrt(sum((b - my) ** 2 for b in y))
    return cov / (sx * sy) if sx and sy else float("nan")


def run_arm(task_name: str, parametrization: str, ratios: Sequence[int], quick: bool) -> dict[str, Any]:
    """Train ``task``'s configurations at every ratio in one parametrization (one worker process)."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*self.log.*")
    task = next(t for t in tasks(quick) if t.name == task_name)
    runs = {}
    for ratio in ratios:
        start = time.perf_counter()
        models = build_trials(task, ratio, parametrization)
        values = train_configurations(models, task.datamodule(), task.steps, task.metric)
        seconds = time.perf_counter() - start
        runs[f"{parametrization}/{ratio}"] = {"values": values, "seconds": seconds}
        best = min(v if math.isfinite(v) else math.inf for v in values)
        print(f"{task.name} {parametrization} S={ratio}: {seconds:.1f}s, best {best:.4f}", flush=True)
    return runs


def run_task(task: Task, ratios: Sequence[int], quick: bool, workers: int) -> dict[str, Any]:
    """Both parametrizations of ``task`` (in parallel worker processes), ranked against S = 1."""
    result: dict[str, Any] = {"configurations": task.configurations, "runs": {}}
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(run_arm, task.name, p, ratios, quick) for p in PARAMETRIZATIONS]
        for future in futures:
            result["runs"].update(future.result())
    for parametrization in PARAMETRIZATIONS:
        reference = result["runs"][f"{parametrization}/1"]["values"]
        for ratio in ratios:
            run = result["runs"][f"{parametrization}/{ratio}"]
            run["spearman"] = spearman(reference, run["values"])
    return result


def write_table(results: dict[str, Any], tasks_: Sequence[Task], ratios: Sequence[int], path: Path) -> None:
    lines = [
        "| task | S | width | muP Spearman | SP Spearman | muP time (s) | SP time (s) | muP best | SP best |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task in tasks_:
        runs = results[task.name]["runs"]
        for ratio in ratios:
            mup, sp = runs[f"mup/{ratio}"], runs[f"sp/{ratio}"]
            lines.append(
                f"| {task.name} | {ratio} | {task.width_key}={task.full_width // ratio} | "
                f"{mup['spearman']:.3f} | "
                f"{sp['spearman']:.3f} | {mup['seconds']:.1f} | {sp['seconds']:.1f} | "
                f"{_describe_best(task, mup['values'])} | {_describe_best(task, sp['values'])} |"
            )
    path.write_text("\n".join(lines) + "\n")


def _describe_best(task: Task, values: Sequence[float]) -> str:
    finite = [v if math.isfinite(v) else math.inf for v in values]
    best = min(range(len(values)), key=lambda i: finite[i])
    config = ", ".join(f"{k}={v:g}" for k, v in task.configurations[best].items())
    return f"{config} ({values[best]:.3f})"


def plot(results: dict[str, Any], tasks_: Sequence[Task], ratios: Sequence[int], path: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(tasks_), 3, figsize=(15, 4.2 * len(tasks_)), squeeze=False)
    for row, task in zip(axes, tasks_):
        runs = results[task.name]["runs"]
        for parametrization, marker in zip(PARAMETRIZATIONS, "os"):
            row[0].plot(
                ratios,
                [runs[f"{parametrization}/{r}"]["spearman"] for r in ratios],
                marker=marker,
                label={"mup": "muP", "sp": "standard"}[parametrization],
            )
        row[0].axhline(0.85, color="grey", linestyle=":", linewidth=1)
        row[0].set_xscale("log", base=2)
        row[0].set_xticks(list(ratios), [str(r) for r in ratios])
        row[0].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        row[0].set(
            ylim=(-0.2, 1.05),
            xlabel="width divisor S",
            ylabel="Spearman vs S = 1",
            title=f"{task.name}: rank fidelity",
        )
        row[0].legend()
        lr_key, other_key = task.grid
        lrs = list(task.grid[lr_key])
        for col, parametrization in zip(row[1:], PARAMETRIZATIONS):
            for ratio in ratios:
                values = runs[f"{parametrization}/{ratio}"]["values"]
                best = [
                    min(
                        (v for v, c in zip(values, task.configurations) if c[lr_key] == lr and math.isfinite(v)),
                        default=math.nan,
                    )
                    for lr in lrs
                ]
                col.plot(lrs, best, marker="o", label=f"S = {ratio}")
            name = {"mup": "muP", "sp": "standard parametrization"}[parametrization]
            col.set(
                xscale="log",
                xlabel=lr_key,
                ylabel=f"{task.metric} (best over {other_key})",
                title=f"{task.name}: {name}",
            )
            col.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def coord_checks(task: Task, widths: Sequence[int], lr: float, steps: int = 3) -> dict[str, CoordCheck]:
    """muP and standard-parametrization coordinate checks of ``task``'s model (Adam-family at ``lr``)."""
    datamodule = task.datamodule()
    datamodule.setup("fit")
    loader = iter(datamodule.train_dataloader())
    batches = [next(loader) for _ in range(steps + 1)]
    fixed = {**task.fixed, "lr": lr}
    if task.fixed.get("optimizer") == "sgd":
        fixed["optimizer"] = "adam"
    surrogate = Surrogate(task.factory, width=[task.width_key])

    def mup(width: int) -> L.LightningModule:
        torch.manual_seed(task.seed)
        return surrogate.build(ratio=widths[-1] // width, **fixed, **{task.width_key: widths[-1]})

    def standard(width: int) -> L.LightningModule:
        torch.manual_seed(task.seed)
        return task.factory(**fixed, **{task.width_key: width})

    return {
        f"{task.name} muP": coord_check(mup, widths, batches, steps=steps),
        f"{task.name} standard": coord_check(standard, widths, batches, steps=steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps: a smoke test, not a measurement")
    parser.add_argument("--tasks", nargs="+", default=["digits", "char_lm"])
    parser.add_argument("--workers", type=int, default=2, help="processes (one thread each): one per core")
    parser.add_argument("--ratios", type=int, nargs="+", default=list(RATIOS))
    parser.add_argument("--no-coord-check", action="store_true", help="skip the coordinate check")
    parser.add_argument("--no-fidelity", action="store_true", help="only the coordinate check")
    parser.add_argument("--from-json", type=Path, help="rewrite table and plot from a results file, no training")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*self.log.*")
    selected = [task for task in tasks(args.quick) if task.name in args.tasks]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        results = json.loads(args.from_json.read_text())
        selected = [task for task in selected if task.name in results]
        ratios = sorted(int(key.split("/")[1]) for key in results[selected[0].name]["runs"] if key.startswith("sp/"))
        write_table(results, selected, ratios, args.out / "scaling_fidelity.md")
        plot(results, selected, ratios, args.out / "scaling_fidelity.png")
        return
    coord_lines = [
        "| task | parametrization | largest spread across widths, step 3 (layer) | logits growth |",
        "|---|---|---|---|",
    ]
    for task in [] if args.no_coord_check else selected:
        widths, layers, lr = COORD_CHECK[task.name]
        checks = coord_checks(task, widths, lr=lr)
        plot_coord_checks(checks, args.out / f"scaling_coord_check_{task.name}.png", layers=layers)
        for name, check in checks.items():
            spread, layer = max((check.spread(layer, 3), layer) for layer in layers if layer != "head")
            growth = check.growth("head", 3)
            coord_lines.append(f"| {task.name} | {name.split()[-1]} | {spread:.2f} ({layer}) | {growth:.2f} |")
    (args.out / "scaling_coord_check.md").write_text("\n".join(coord_lines) + "\n")
    print("\n".join(coord_lines), flush=True)
    if args.no_fidelity:
        return
    ratios = sorted(set(args.ratios) | {1})
    results = {task.name: run_task(task, ratios, args.quick, args.workers) for task in selected}
    raw = ROOT / "benchmarks" / "results"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "fidelity.json").write_text(json.dumps(results, indent=1))
    write_table(results, selected, ratios, args.out / "scaling_fidelity.md")
    plot(results, selected, ratios, args.out / "scaling_fidelity.png")
    print((args.out / "scaling_fidelity.md").read_text())


if __name__ == "__main__":
    main()
