"""Training throughput of fused trials versus a loop and versus separate runs, measured side by side.

For each width and number of trials B, one process measures (median over repeats, after warm-up):

- ``fused[<backend>]``: FusedLightningModule in a Lightning Trainer, per backend;
- ``separate``: B ordinary Trainer runs one after another (each trial's own LightningModule);
- ``raw vmap``: a hand-written torch training loop (stack_module_state + functional_call + vmap, per-trial
  SGD learning rates as a [B] tensor): no Lightning at all, the floor for FusedLightningModule's overhead;
- ``lightning vmap``: the same vmapped step inside a minimal hand-written LightningModule: Lightning's
  own per-step cost, to tell it apart from FusedLightningModule's.

Every number is the steady-state time of one optimizer step of the whole group (median of the per-step
intervals after warm-up steps), so Trainer start-up is excluded (reported separately for `separate`).
Ratios are against the ``loop`` backend and against ``separate``.

Run::

    python benchmarks/fusion_throughput.py                       # the issue's table: MLP, widths 64/256
    python benchmarks/fusion_throughput.py --trials 1 4 16 --widths 64 --steps 40 --repeats 2   # quick
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP


class StepTimer(L.Callback):
    """Records the wall time of every training batch (optimizer step) after the first `warmup` ones."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.times: list[float] = []
        self._last = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._last = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step > self.warmup:
            self.times.append(time.perf_counter() - self._last)


def trainer_for(steps: int, device: str, callbacks: list[L.Callback]) -> L.Trainer:
    return L.Trainer(
        max_steps=steps,
        accelerator=device,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=callbacks,
    )


def make_trials(count: int, width: int) -> list[DigitsMLP]:
    return [DigitsMLP(hidden_dim=width, lr=0.01 * (1 + i), momentum=0.9) for i in range(count)]


def time_fused(count: int, width: int, backend: str, steps: int, warmup: int, device: str) -> float:
    timer = StepTimer(warmup)
    fused = FusedLightningModule(make_trials(count, width), backend=backend, summary=False, verify=False)
    trainer_for(steps, device, [timer]).fit(fused, datamodule=DigitsDataModule())
    return statistics.median(timer.times)


def time_separate(count: int, width: int, steps: int, warmup: int, device: str, measured: int) -> tuple[float, float]:
    """(per group step, start-up per run): `measured` runs are timed and scaled to `count` (they are identical)."""
    per_step, startup = [], []
    for trial in make_trials(min(count, measured), width):
        timer = StepTimer(warmup)
        start = time.perf_counter()
        trainer_for(steps, device, [timer]).fit(trial, datamodule=DigitsDataModule())
        total = time.perf_counter() - start
        per_step.append(statistics.median(timer.times))
        startup.append(total - sum(timer.times) * steps / max(1, len(timer.times)))
    return statistics.mean(per_step) * count, statistics.mean(startup)


def raw_vmap_step(count: int, width: int, device: str) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A hand-written fused training step: vmap over stacked MLPs, SGD with momentum and per-trial lr."""
    models = [DigitsMLP(hidden_dim=width) for _ in range(count)]
    params, _ = stack_module_state(models)  # the MLP has no buffers
    params = {k: v.to(device).requires_grad_() for k, v in params.items()}
    template = models[0].to("meta")
    lrs = torch.tensor([0.01 * (1 + i) for i in range(count)], device=device)
    momentum = {k: torch.zeros_like(v) for k, v in params.items()}

    def loss_of(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(template, p, (x,)), y)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        losses = vmap(loss_of, in_dims=(0, None, None))(params, x, y)
        grads = torch.autograd.grad(losses.sum(), list(params.values()))
        with torch.no_grad():
            for (name, p), g in zip(params.items(), grads):
                buf = momentum[name].mul_(0.9).add_(g)
                p.sub_(lrs.view(-1, *[1] * (p.dim() - 1)) * buf)

    return step


def time_raw(count: int, width: int, steps: int, warmup: int, device: str) -> float:
    dm = DigitsDataModule()
    dm.setup("fit")
    step = raw_vmap_step(count, width, device)
    times: list[float] = []
    done = 0
    while done < steps:
        for x, y in dm.train_dataloader():  # the same data pipeline as the Trainer runs
            start = time.perf_counter()
            step(x.to(device), y.to(device))
            if device == "cuda":
                torch.cuda.synchronize()
            if done >= warmup:
                times.append(time.perf_counter() - start)
            done += 1
            if done >= steps:
                break
    return statistics.median(times)


class LightningVmap(L.LightningModule):
    """The raw vmapped step inside a minimal LightningModule (manual optimization): Lightning's own cost."""

    def __init__(self, count: int, width: int) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.count, self.width = count, width
        self._step: Callable[[torch.Tensor, torch.Tensor], None] | None = None

    def training_step(self, batch: Any, batch_idx: int) -> None:
        if self._step is None:
            self._step = raw_vmap_step(self.count, self.width, self.device.type)
        self._step(*batch)

    def configure_optimizers(self) -> None:
        return None


def time_lightning_vmap(count: int, width: int, steps: int, warmup: int, device: str) -> float:
    timer = StepTimer(warmup)
    trainer_for(steps, device, [timer]).fit(LightningVmap(count, width), datamodule=DigitsDataModule())
    return statistics.median(timer.times)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--backends", nargs="+", default=["vmap", "loop"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--separate-runs", type=int, default=4, help="separate runs timed per cell (then scaled)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/fusion_throughput.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    columns = [*(f"fused[{b}]" for b in args.backends), "separate", "raw vmap", "lightning vmap"]
    header = (
        f"| width | B | {' | '.join(f'{c} ms/step' for c in columns)} | vmap speed-up vs loop "
        "| vmap speed-up vs separate | overhead vs raw | overhead vs lightning vmap |"
    )
    lines = [
        f"Device: {args.device}, torch threads: {args.threads}, {args.steps} steps ({args.warmup} warm-up), median of "
        f"{args.repeats} repeats; ms per optimizer step of the whole group of B trials.",
        "",
        header,
        "|" + "---|" * (header.count("|") - 1),
    ]
    print("\n".join(lines), flush=True)
    for width in args.widths:
        for count in args.trials:
            cells: dict[str, list[float]] = {c: [] for c in columns}
            startup: list[float] = []
            for _ in range(args.repeats):
                for backend in args.backends:
                    cells[f"fused[{backend}]"].append(
                        time_fused(count, width, backend, args.steps, args.warmup, args.device)
                    )
                per_step, start = time_separate(count, width, args.steps, args.warmup, args.device, args.separate_runs)
                cells["separate"].append(per_step)
                startup.append(start)
                cells["raw vmap"].append(time_raw(count, width, args.steps, args.warmup, args.device))
                cells["lightning vmap"].append(time_lightning_vmap(count, width, args.steps, args.warmup, args.device))
            ms = {c: 1000 * statistics.median(v) for c, v in cells.items()}
            fused = ms.get("fused[vmap]", ms[columns[0]])
            row = (
                f"| {width} | {count} | {' | '.join(f'{ms[c]:.2f}' for c in columns)} | "
                f"{ms.get('fused[loop]', float('nan')) / fused:.2f}x | {ms['separate'] / fused:.2f}x | "
                f"{100 * (fused / ms['raw vmap'] - 1):+.0f}% | {100 * (fused / ms['lightning vmap'] - 1):+.0f}% |"
            )
            lines.append(row)
            print(row, flush=True)
    lines += [
        "",
        f"`separate` also pays {statistics.median(startup):.2f} s of Trainer start-up per run (not in its column).",
    ]
    text = "\n".join(lines) + "\n"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(lines[-1])
    return text


if __name__ == "__main__":
    main()
