"""``fusion_throughput.py --model template_mnist``: the lightning-hydra-template module fused, side by side.

The module is lightning_hydro/demos/template_mnist.py's ``MNISTLitModule`` (the template's published structure:
torchmetrics ``Accuracy``/``MeanMetric`` updated in every step and logged as objects, ``MaxMetric`` in
``on_validation_epoch_end``, Adam and ReduceLROnPlateau partials) with the template's default sizes
(``SimpleDenseNet`` 784-64-128-64-10, batch 128), on digits upsampled to 28x28. For each B, one process
measures, per repeat and in the same order:

- ``fused[auto]``: the backend ``auto`` picks on the first batch (its choice cache is cleared before each
  run, so every repeat chooses again; the first run's explanation is printed);
- ``fused[<backend>]``: each backend pinned (``loop`` is the baseline of the ratios);
- ``separate``: B ordinary Trainer runs one after another (``--separate-runs`` of them timed, then scaled).

Numbers are the median over repeats of each run's median interval between training batches after warm-up
(validation, two batches per epoch, falls outside those intervals). Then:

- what the deferred torchmetrics cost under vmap at the largest B: the backend's forward+backward of
  ``training_step`` for the template module versus the same module with its metric lines left out
  (interleaved, median), i.e. recording the calls plus replaying them on each trial's metrics;
- for B = 4, per-trial ``val/acc`` after 2 epochs: ``auto``-fused versus separate runs, in validation images
  (250 of them).
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import time
from typing import Any

import lightning as L
import torch
from torch import nn

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends import make_backend
from lightning_hydro.backends.auto import clear_backend_cache
from lightning_hydro.demos.template_mnist import DigitsMNISTDataModule, MNISTLitModule, SimpleDenseNet
from lightning_hydro.stacking.stacked_state import StackedState

BATCH_SIZE = 128  # the template's configs/data/mnist.yaml
VALIDATION_IMAGES = 250


def make_trials(count: int) -> list[MNISTLitModule]:
    trials = []
    for i in range(count):
        torch.manual_seed(i)
        trials.append(
            MNISTLitModule(
                net=SimpleDenseNet(lin1_size=64, lin2_size=128, lin3_size=64),  # the template's configs/model
                optimizer=functools.partial(torch.optim.Adam, lr=1e-3 * (1 + i), weight_decay=0.0),
                scheduler=functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, mode="min", patience=10),
            )
        )
    return trials


def _trainer(callbacks: list[L.Callback], device: str, **overrides: Any) -> L.Trainer:
    settings: dict[str, Any] = {
        "accelerator": device,
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 2,
        "callbacks": callbacks,
    }
    settings.update(overrides)
    return L.Trainer(**settings)


def time_run(module: L.LightningModule, timer: Any, steps: int, device: str) -> float:
    _trainer([timer], device, max_steps=steps).fit(module, datamodule=DigitsMNISTDataModule(batch_size=BATCH_SIZE))
    return statistics.median(timer.times)


def time_fused(count: int, backend: str, args: argparse.Namespace, timer_class: Any) -> tuple[float, str, str]:
    """(seconds per step, the backend used, the module's backend report)."""
    clear_backend_cache()
    fused = FusedLightningModule(make_trials(count), backend=backend, summary=False)
    seconds = time_run(fused, timer_class(args.warmup, args.steps), args.steps, args.device)
    return seconds, fused.backend or backend, fused.backend_report


def time_separate(count: int, args: argparse.Namespace, timer_class: Any) -> float:
    per_step = [
        time_run(trial, timer_class(args.warmup, args.steps), args.steps, args.device)
        for trial in make_trials(min(count, args.separate_runs))
    ]
    return statistics.mean(per_step) * count


class WithoutMetrics(MNISTLitModule):
    """The template module with its torchmetrics lines left out of ``training_step`` (for the cost of deferral)."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, _, _ = self.model_step(batch)
        return loss


def metrics_cost(count: int, rounds: int = 15) -> tuple[float, float]:
    """(ms per vmap forward+backward of training_step with the template's metrics, ms without them)."""
    with_metrics = make_trials(count)
    without = [WithoutMetrics(net=m.net, optimizer=m.hparams["optimizer"], scheduler=None) for m in make_trials(count)]
    runners = [
        make_backend("vmap", StackedState(nn.Module(), trials, list(range(count))))
        for trials in (with_metrics, without)
    ]
    data = DigitsMNISTDataModule(batch_size=BATCH_SIZE)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    times: list[list[float]] = [[], []]
    for round_index in range(rounds + 2):
        for which, runner in enumerate(runners):
            start = time.perf_counter()
            loss = runner.run("training_step", batch, round_index).loss()
            assert loss is not None
            loss.sum().backward()
            if round_index >= 2:  # two warm-up rounds
                times[which].append(time.perf_counter() - start)
    return 1000 * statistics.median(times[0]), 1000 * statistics.median(times[1])


def val_acc_in_images(count: int, device: str) -> tuple[str, list[float]]:
    """(backend auto picked, per-trial |val/acc fused - val/acc alone| x 250) after 2 epochs."""

    def fit(module: L.LightningModule) -> dict[str, float]:
        trainer = _trainer([], device, max_epochs=2, limit_val_batches=None)
        torch.manual_seed(1234)
        trainer.fit(module, datamodule=DigitsMNISTDataModule(batch_size=BATCH_SIZE))
        return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/acc")}

    trials = make_trials(count)
    alone = [fit(copy.deepcopy(m))["val/acc"] for m in trials]
    clear_backend_cache()
    fused = FusedLightningModule([copy.deepcopy(m) for m in trials], backend="auto", summary=False)
    values = fit(fused)
    images = [round(abs(values[f"val/acc/trial_{t}"] - a) * VALIDATION_IMAGES, 3) for t, a in enumerate(alone)]
    return fused.backend or "auto", images


def template_table(args: argparse.Namespace, timer_class: Any) -> list[str]:
    backends = [b for b in args.backends if b not in ("auto", "loop")]
    columns = ["fused[auto]", *(f"fused[{b}]" for b in backends), "fused[loop]", "separate"]
    header = (
        f"| B | auto chose | {' | '.join(f'{c} ms/step' for c in columns)} | auto speed-up vs loop "
        "| auto speed-up vs separate |"
    )
    lines = [
        f"Device: {args.device}, torch threads: {args.threads}, {args.steps} steps ({args.warmup} warm-up), median "
        f"of {args.repeats} repeats; ms per optimizer step of the whole group of B trials (batch {BATCH_SIZE}).",
        "",
        header,
        "|" + "---|" * (header.count("|") - 1),
    ]
    print("\n".join(lines), flush=True)
    reports: list[str] = []
    for count in args.trials:
        cells: dict[str, list[float]] = {c: [] for c in columns}
        chosen: list[str] = []
        for _ in range(args.repeats):
            seconds, used, report = time_fused(count, "auto", args, timer_class)
            cells["fused[auto]"].append(seconds)
            chosen.append(used)
            if len(chosen) == 1:
                reports.append(f"B={count}: {report}")
                print(reports[-1], flush=True)
            for backend in [*backends, "loop"]:
                cells[f"fused[{backend}]"].append(time_fused(count, backend, args, timer_class)[0])
            cells["separate"].append(time_separate(count, args, timer_class))
        ms = {c: 1000 * statistics.median(v) for c, v in cells.items()}
        picks = ", ".join(f"{name} x{chosen.count(name)}" for name in dict.fromkeys(chosen))
        row = (
            f"| {count} | {picks} | {' | '.join(f'{ms[c]:.1f}' for c in columns)} | "
            f"{ms['fused[loop]'] / ms['fused[auto]']:.2f}x | {ms['separate'] / ms['fused[auto]']:.2f}x |"
        )
        lines.append(row)
        print(row, flush=True)
    lines += ["", "First batch's choice, as the fused module logs it (first repeat):", ""]
    lines += [f"- {report}" for report in reports]
    count = max(args.trials)
    with_metrics, without = metrics_cost(count)
    lines += [
        "",
        f"Deferred torchmetrics under vmap, B = {count}: forward+backward of training_step {with_metrics:.1f} ms with "
        f"the template's metrics, {without:.1f} ms without them (median of 15 interleaved rounds): "
        f"{100 * (with_metrics / without - 1):+.0f}%.",
    ]
    print(lines[-1], flush=True)
    backend, images = val_acc_in_images(4, args.device)
    lines += [
        "",
        f"val/acc after 2 epochs, B = 4, fused (auto chose {backend!r}) vs separate runs, |difference| in validation "
        f"images of {VALIDATION_IMAGES}: {images}",
    ]
    print("\n".join(lines[-1:]), flush=True)
    return lines
