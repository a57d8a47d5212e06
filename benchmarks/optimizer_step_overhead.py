"""What a trial's own ``optimizer_step`` costs a fused step: the same group with and without the override.

The override (the LightningModule docs' warm-up after ``optimizer.step``) runs per trial as a greenlet that pauses
in its step (``lightning_hydro/fused/lightning/trial_optimizer_steps.py``); this times the fused vmap step of B
digits MLPs with it and without it, alternating, and prints the medians and their difference per trial::

    PYTHONPATH=. python benchmarks/optimizer_step_overhead.py --trials 16 --width 8 --steps 200 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from fusion_throughput import StepTimer, trainer_for

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP


class WarmupInOptimizerStep(DigitsMLP):
    """The LightningModule docs' warm-up, written after the step in ``optimizer_step``."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        optimizer.step(closure=optimizer_closure)
        if self.trainer.global_step < 100:
            scale = min(1.0, float(self.trainer.global_step + 1) / 100)
            for group in optimizer.param_groups:
                group["lr"] = scale * self.hparams["lr"]


def step_ms(cls: type, trials: int, width: int, steps: int) -> float:
    timer = StepTimer(warmup=20, steps=steps)
    modules = [cls(hidden_dim=width, lr=0.01 * (1 + i), momentum=0.9) for i in range(trials)]
    fused = FusedLightningModule(modules, backend="vmap", summary=False, verify=False)
    trainer_for(steps, "cpu", [timer]).fit(fused, datamodule=DigitsDataModule())
    return statistics.median(timer.times) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    plain, overridden = [], []
    for _ in range(args.repeats):
        plain.append(step_ms(DigitsMLP, args.trials, args.width, args.steps))
        overridden.append(step_ms(WarmupInOptimizerStep, args.trials, args.width, args.steps))
    a, b = statistics.median(plain), statistics.median(overridden)
    print(f"B = {args.trials}, width {args.width}, fused vmap, median ms per step over {args.repeats} alternated fits:")
    print(f"  without the override {a:.3f} ({', '.join(f'{t:.3f}' for t in plain)})")
    print(f"  with optimizer_step  {b:.3f} ({', '.join(f'{t:.3f}' for t in overridden)})")
    print(f"  difference {b - a:.3f} ms per step, {(b - a) / args.trials * 1e3:.0f} us per trial")


if __name__ == "__main__":
    main()
