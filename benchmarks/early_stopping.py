"""Early stopping across trials on the digits task: budget, wall time and best accuracy, side by side.

27 DigitsMLP trials (9 learning rates x 3 momenta), reduction factor 3, grace period 1, max_t = 9 epochs:

- ``fused + SuccessiveHalving``: one FusedLightningModule (vmap) of 27 trials; losers leave their slots.
- ``fused + ASHA, 9 slots + refill``: a group of 9 whose freed slots take the other 18 trials.
- ``fused, no stopping``: all 27 fused, trained to 9 epochs (the exhaustive run).
- ``27 separate runs``: one Trainer per trial, 9 epochs each (the exhaustive run, unfused).
- ``27 separate runs + ASHA``: one Trainer per trial in sequence, sharing rung records through SQLite.

Every trial starts from the same weights in every run (seeded per trial) and sees the same batches, so a trial
trained to the end reaches the same accuracy whichever run trained it. Runs are interleaved round by round after
a warm-up; the median wall time is reported.

Run: PYTHONPATH=. python benchmarks/early_stopping.py [--repeats 3] [--output benchmarks/results/early_stopping.md]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch

from lightning_hydro import FusedLightningModule
from lightning_hydro.callbacks import ASHA, SuccessiveHalving
from lightning_hydro.demos import DigitsDataModule, DigitsMLP, load_digits_tensors

LEARNING_RATES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
MOMENTA = (0.0, 0.5, 0.9)
GRID = [(lr, momentum) for momentum in MOMENTA for lr in LEARNING_RATES]
MAX_T, ETA, GRACE = 9, 3, 1
DEFAULT_OUTPUT = Path(__file__).parent / "results" / "early_stopping.md"


@dataclass
class Outcome:
    """One run: per-trial epochs trained and final validation accuracy of the trials trained to max_t."""

    name: str
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    epochs: dict[int, int] = field(default_factory=dict)
    final_acc: dict[int, float] = field(default_factory=dict)  # trials that reached max_t


def trial(index: int) -> DigitsMLP:
    torch.manual_seed(index)
    lr, momentum = GRID[index]
    return DigitsMLP(lr=lr, momentum=momentum)


def trainer(max_epochs: int, callbacks: list[Any] | None = None, **overrides: Any) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        max_epochs=max_epochs,
        callbacks=callbacks or [],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **overrides,
    )


def fit(module: L.LightningModule, max_epochs: int, callbacks: list[Any] | None = None, **overrides: Any) -> None:
    torch.manual_seed(1234)
    trainer(max_epochs, callbacks, **overrides).fit(module, datamodule=DigitsDataModule(batch_size=64))


def fused_results(module: FusedLightningModule, outcome: Outcome) -> None:
    for tid, result in module.results.items():
        outcome.epochs[tid] = result["epochs"]
        if result["epochs"] >= MAX_T and result["status"] != "diverged":
            outcome.final_acc[tid] = result["metrics"]["val_acc"]


def run_fused_halving(outcome: Outcome) -> None:
    module = FusedLightningModule([trial(i) for i in range(len(GRID))], backend="vmap", summary=False)
    fit(
        module, MAX_T, [SuccessiveHalving("val_acc", mode="max", grace_period=GRACE, reduction_factor=ETA, max_t=MAX_T)]
    )
    fused_results(module, outcome)


def run_fused_asha_refill(outcome: Outcome) -> None:
    slots = 9
    module = FusedLightningModule([trial(i) for i in range(slots)], backend="vmap", summary=False)
    refill = (trial(i) for i in range(slots, len(GRID)))
    callback = ASHA("val_acc", mode="max", grace_period=GRACE, reduction_factor=ETA, max_t=MAX_T, refill=refill)
    fit(module, 4 * MAX_T, [callback])  # the group ends when every trial has ended
    fused_results(module, outcome)


def run_fused_exhaustive(outcome: Outcome) -> None:
    module = FusedLightningModule([trial(i) for i in range(len(GRID))], backend="vmap", summary=False)
    fit(module, MAX_T)
    fused_results(module, outcome)


def run_separate(outcome: Outcome) -> None:
    for index in range(len(GRID)):
        module = trial(index)
        run = trainer(MAX_T)
        torch.manual_seed(1234)
        run.fit(module, datamodule=DigitsDataModule(batch_size=64))
        outcome.epochs[index] = MAX_T
        outcome.final_acc[index] = float(run.callback_metrics["val_acc"])


def run_separate_asha(outcome: Outcome) -> None:
    with tempfile.TemporaryDirectory() as directory:
        storage = os.path.join(directory, "asha.db")
        for index in range(len(GRID)):
            callback = ASHA(
                "val_acc", mode="max", grace_period=GRACE, reduction_factor=ETA, max_t=MAX_T, storage=storage,
                trial_id=index,
            )  # fmt: skip
            run = trainer(MAX_T, [callback])
            torch.manual_seed(1234)
            run.fit(trial(index), datamodule=DigitsDataModule(batch_size=64))
            outcome.epochs[index] = callback.result["budget"]
            if callback.status == "completed":
                outcome.final_acc[index] = float(run.callback_metrics["val_acc"])


RUNS: list[tuple[str, Callable[[Outcome], None]]] = [
    ("fused + SuccessiveHalving", run_fused_halving),
    ("fused + ASHA, 9 slots + refill", run_fused_asha_refill),
    ("fused, no stopping", run_fused_exhaustive),
    ("27 separate runs + ASHA (SQLite)", run_separate_asha),
    ("27 separate runs, no stopping", run_separate),
]


def warm_up() -> None:
    """Imports, vmap tracing and Lightning's first-fit costs, paid before anything is timed."""
    module = FusedLightningModule([trial(i) for i in range(3)], backend="vmap", summary=False)
    fit(module, 1, limit_train_batches=3, limit_val_batches=1)
    fit(trial(0), 1, limit_train_batches=3, limit_val_batches=1)


def describe(index: int) -> str:
    lr, momentum = GRID[index]
    return f"lr={lr:g}, momentum={momentum:g}"


def table(outcomes: list[Outcome], repeats: int) -> str:
    reference = next(o for o in outcomes if o.name == "fused, no stopping")
    ranking = sorted(reference.final_acc, key=lambda tid: -reference.final_acc[tid])
    separate = statistics.median(next(o for o in outcomes if o.name.startswith("27 separate runs, no")).seconds)
    separate_cpu = statistics.median(next(o for o in outcomes if o.name.startswith("27 separate runs, no")).cpu_seconds)
    lines = [
        f"| run | trial-epochs (of 243) | trained to max_t | wall time, s: median (min) of {repeats} | CPU time, s | "
        "speed-up vs 27 separate runs (wall / CPU) | best final val acc | best trial (rank in exhaustive run) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for outcome in outcomes:
        best = max(outcome.final_acc, key=lambda tid: (outcome.final_acc[tid], -tid))
        seconds, cpu = statistics.median(outcome.seconds), statistics.median(outcome.cpu_seconds)
        lines.append(
            f"| {outcome.name} | {sum(outcome.epochs.values())} | {len(outcome.final_acc)} | {seconds:.1f} "
            f"({min(outcome.seconds):.1f}) | "
            f"{cpu:.1f} | {separate / seconds:.1f}x / {separate_cpu / cpu:.1f}x | {outcome.final_acc[best]:.4f} | "
            f"{describe(best)} (#{ranking.index(best) + 1}) |"
        )
    top = [reference.final_acc[tid] for tid in ranking[:5]]
    images = len(load_digits_tensors()[1])
    lines += [
        "",
        f"Exhaustive run, top 5 final val acc: {', '.join(f'{acc:.4f}' for acc in top)} "
        f"(validation set: {images} images, so one image is {1 / images:.4f}).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")

    load_before = os.getloadavg()
    warm_up()
    outcomes = [Outcome(name) for name, _ in RUNS]
    for _ in range(args.repeats):
        for outcome, (_, run) in zip(outcomes, RUNS):
            fresh = Outcome(outcome.name)
            started, cpu_started = time.perf_counter(), time.process_time()
            run(fresh)
            outcome.seconds.append(time.perf_counter() - started)
            outcome.cpu_seconds.append(time.process_time() - cpu_started)
            outcome.epochs, outcome.final_acc = fresh.epochs, fresh.final_acc
    load_after = os.getloadavg()

    header = (
        f"27 trials (lr x momentum), reduction_factor={ETA}, grace_period={GRACE}, max_t={MAX_T} epochs; "
        f"torch {torch.__version__}, lightning {L.__version__}, {os.cpu_count()} CPU cores, "
        f"{torch.get_num_threads()} torch threads; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after.\n"
    )
    text = header + "\n" + table(outcomes, args.repeats) + "\n"
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)


if __name__ == "__main__":
    main()
