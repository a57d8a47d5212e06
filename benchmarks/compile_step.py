"""Eager versus ``compile=True`` fused training steps, side by side (``fusion_throughput.py --model compile``).

For each case, one process times the same FusedLightningModule (backend vmap, fused SGD/AdamW update) in a
Lightning Trainer three times: eager, compiled as a split step (forward and backward, then the update, with
Lightning between them) and compiled as one whole step (``lightning_hydro/fused/step/whole_step.py``), and reports:

- ms per optimizer step of the whole group (median of the per-step intervals after the warm-up steps);
- the first step's time (with ``compile=True`` it includes tracing and inductor's compilation; inductor keeps
  an on-disk cache, so a later process that compiles the same graph pays less: the first repeat is cold only
  if the cache was);
- dynamo is reset before each run (inductor's on-disk cache is not);
- the recompilation cost of slot changes: two trials are stopped during the run (the group shrinks B -> B-1 ->
  B-2); the step after each change minus the steady step.

Cases: the digits MLP (widths 64 and 256, B = 4, 16, 64), the network of lightning-hydra-template's
MNISTLitModule (SimpleDenseNet: Linear-BatchNorm1d-ReLU blocks, in a step without the template's torchmetrics
calls, so that the compiled graph is the network's alone), the template's module itself (``template_module``:
its torchmetrics calls, on the digits at MNIST's shape) and the small Transformer LM of ``--model transformer``.

A second table (:func:`counters_table`) times a digits MLP whose step reads Lightning's counters (it logs every
4th batch, weighs every 3rd step's loss and doubles it from epoch 1 on): eager, compiled with the step's ints
specialised (``torch._dynamo.config.automatic_dynamic_shapes=False``: a graph per value, as compile= did before
the counters could be symbolic) and compiled as the library does now.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from fusion_throughput import trainer_for  # next to this file (on sys.path when run as a script)

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends import compiled_step
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from lightning_hydro.demos.template_mnist import DigitsMNISTDataModule, MNISTLitModule, SimpleDenseNet

__all__ = ["compile_table", "counters_table"]


class TemplateNetTrial(L.LightningModule):
    """The template's SimpleDenseNet (8x8 digits in), cross-entropy and Adam, without torchmetrics objects."""

    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.lr = lr
        self.net = SimpleDenseNet(input_size=64, lin1_size=64, lin2_size=128, lin3_size=64)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class CountingMLP(DigitsMLP):
    """The digits MLP with a step that branches on ``batch_idx``, ``self.global_step`` and ``self.current_epoch``."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        if batch_idx % 4 == 0:
            self.log("train/sampled", loss)
        if self.global_step % 3 == 0:
            loss = loss * 1.5
        if self.current_epoch >= 1:
            loss = loss * 2
        self.log("train/loss", loss)
        return loss


class Probe(L.Callback):
    """Per-batch wall times; stops trials at the given steps (slot changes), ends the fit after ``steps``."""

    def __init__(self, steps: int, stops: dict[int, int]) -> None:
        self.steps, self.stops = steps, stops
        self.times: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        self.times.append(time.perf_counter() - self._start)
        done = len(self.times)
        if done in self.stops:
            pl_module.stop_trial(self.stops[done], "benchmark slot change")
        if done >= self.steps:
            trainer.should_stop = True


def _trials(case: str, count: int, width: int) -> list[L.LightningModule]:
    torch.manual_seed(0)
    if case in ("digits", "counting"):
        module = CountingMLP if case == "counting" else DigitsMLP
        return [module(hidden_dim=width, lr=0.01 * (1 + i), momentum=0.9) for i in range(count)]
    if case == "template":
        return [TemplateNetTrial(1e-3 * (1 + i)) for i in range(count)]
    if case == "template_module":  # the template's own LightningModule: torchmetrics in its steps
        net = {"lin1_size": width, "lin2_size": width, "lin3_size": width // 2}
        return [
            MNISTLitModule(
                net=SimpleDenseNet(**net),
                optimizer=functools.partial(torch.optim.Adam, lr=1e-3 * (1 + i)),
                scheduler=None,
            )
            for i in range(count)
        ]
    from fusion_throughput import TransformerTrial  # the --model transformer case

    return [TransformerTrial(1e-4 * (i + 1), d_model=width) for i in range(count)]


def _data(case: str) -> L.LightningDataModule:
    if case == "transformer":
        from fusion_throughput import RandomData

        return RandomData("tokens")
    if case == "template_module":
        return DigitsMNISTDataModule(batch_size=64)
    return DigitsDataModule()


def time_case(
    case: str, count: int, width: int, mode: str, steps: int, warmup: int, device: str, stops: bool = True
) -> dict[str, float]:
    """Seconds: ``step`` (steady median), ``first`` (first step), ``change1``/``change2`` (after slot changes).

    ``mode``: ``"eager"`` (compile=False), ``"split"`` (compile=True with the whole step turned off: forward and
    backward, then the update, compiled apart with Lightning between them), ``"whole"`` (compile=True: a steady
    step is one compiled function) or ``"specialised"`` (``"whole"`` with the step's ints specialised, a graph per
    value, and dynamo's limit of 8 graphs, as before). ``whole`` also counts the steps that ran whole. ``stops``:
    stop two trials on the way (two slot changes).
    """
    first_stop, second_stop = warmup + (steps - warmup) // 3, warmup + 2 * (steps - warmup) // 3
    torch.compiler.reset()  # each case compiles from scratch
    probe = Probe(steps, {first_stop: 1, second_stop: 2} if stops else {})
    fused = FusedLightningModule(_trials(case, count, width), backend="vmap", compile=mode != "eager", summary=False)
    if mode == "split":  # the benchmark's switch (not an option): the step as before the whole step existed
        fused._training_step.whole.setting = False
    trainer = trainer_for(steps, device, [probe])
    with _specialised() if mode == "specialised" else contextlib.nullcontext():
        trainer.fit(fused, datamodule=_data(case))
    times = probe.times
    changes = (first_stop, second_stop) if stops else ()
    steady = [t for i, t in enumerate(times) if i >= warmup and i not in changes]
    step = statistics.median(steady)
    return {
        "step": step,
        "first": times[0],
        "change1": times[first_stop] - step,
        "change2": times[second_stop] - step,
        "whole": fused._training_step.whole.whole_steps,
    }


def compile_table(cases: list[tuple[str, int, int]], steps: int, warmup: int, repeats: int, device: str) -> list[str]:
    """Markdown rows: eager, split-compiled and whole-compiled ms/step, speed-ups, first step and recompile costs."""
    header = (
        "| model | width | B | eager ms/step | compiled, split ms/step | compiled, whole ms/step | whole vs eager |"
        " whole vs split | steps run whole | whole: first step s | recompile after 1st slot change s | after 2nd s |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    print("\n".join(lines), flush=True)
    for case, width, count in cases:
        runs: dict[str, list[dict[str, float]]] = {"eager": [], "split": [], "whole": []}
        for _ in range(repeats):  # side by side: each repeat times all three
            for mode, found in runs.items():
                found.append(time_case(case, count, width, mode, steps, warmup, device))

        def med(mode: str, key: str, runs: dict[str, list[dict[str, float]]] = runs) -> float:
            return statistics.median(r[key] for r in runs[mode])

        e, p, w = (1000 * med(mode, "step") for mode in ("eager", "split", "whole"))
        row = (
            f"| {case} | {width} | {count} | {e:.2f} | {p:.2f} | {w:.2f} | {e / w:.2f}x | {p / w:.2f}x | "
            f"{int(med('whole', 'whole'))}/{steps} | {runs['whole'][0]['first']:.1f} | {med('whole', 'change1'):.1f} | "
            f"{med('whole', 'change2'):.1f} |"
        )
        lines.append(row)
        print(row, flush=True)
    return lines


@contextlib.contextmanager
def _specialised() -> Iterator[None]:
    """compile= as before a step's ints could be symbolic: a graph per value, dynamo's limit of 8 graphs."""
    limit = compiled_step.RECOMPILE_LIMIT
    compiled_step.RECOMPILE_LIMIT = 8
    try:
        with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
            yield
    finally:
        compiled_step.RECOMPILE_LIMIT = limit


def counters_table(width: int, count: int, steps: int, warmup: int, repeats: int, device: str) -> list[str]:
    """Markdown rows for :class:`CountingMLP`: eager, compiled with specialised ints, compiled; steps run whole.

    No slot changes; the times are the medians of the second half of the steps (after the first half's compiles).
    """
    modes = {"eager": "eager", "specialised": "compiled, ints specialised", "whole": "compiled"}
    columns = " | ".join(f"{m} ms/step" for m in modes.values())
    header = f"| model | width | B | {columns} | steps run whole (specialised / now) |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    for _ in range(repeats):  # side by side: each repeat times all three
        for mode, found in runs.items():
            found.append(time_case("counting", count, width, mode, steps, max(warmup, steps // 2), device, stops=False))
    ms = [1000 * statistics.median(r["step"] for r in runs[mode]) for mode in modes]
    whole = [int(statistics.median(r["whole"] for r in runs[mode])) for mode in ("specialised", "whole")]
    lines.append(
        f"| counting | {width} | {count} | {' | '.join(f'{m:.2f}' for m in ms)} | {whole[0]} / {whole[1]} of {steps} |"
    )
    print("\n".join(lines), flush=True)
    return lines
