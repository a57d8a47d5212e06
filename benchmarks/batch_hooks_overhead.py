"""What the trials' own batch-level hooks cost a fused step (lightning_hydro/fused/lightning/batch_hooks.py).

Times training batches of one fused group of digits MLPs on vmap, one thread, with a trial class that overrides
``on_train_batch_end`` (it keeps the step's loss, as research code keeps outputs) and with the plain class, in
separate fits run alternately. A batch is timed from the Trainer's ``on_train_batch_start`` to a callback's
``on_train_batch_end`` (which Lightning runs before the module's, so the hook's own calls fall outside; what
they leave to the next step, such as checking the trials' settings again, falls inside). The figure is the median
of the batches after warm-up, in this thread's CPU time (less disturbed by other processes than wall time), timed by
``fusion_throughput.py``'s ``StepTimer``.

Run::

    PYTHONPATH=. python benchmarks/batch_hooks_overhead.py --trials 16 --steps 300 --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from fusion_throughput import CLOCK, StepTimer, trainer_for  # next to this file (on sys.path when run as a script)

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP


class KeepsItsLosses(DigitsMLP):
    """Keeps each step's loss from ``on_train_batch_end``."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.last_loss = outputs["loss"]


def time_batches(cls: type[DigitsMLP], trials: int, steps: int, warmup: int) -> float:
    """Median thread CPU seconds of a training batch of ``trials`` fused ``cls`` modules."""
    timer = StepTimer(warmup, steps)
    modules = [cls(hidden_dim=8, lr=0.01 * (1 + i), momentum=0.9) for i in range(trials)]
    fused = FusedLightningModule(modules, backend="vmap", summary=False, verify=False)
    trainer_for(steps, "cpu", [timer]).fit(fused, DigitsDataModule())
    return statistics.median(timer.times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    CLOCK["now"] = time.thread_time
    rows: dict[str, list[float]] = {"plain": [], "on_train_batch_end": []}
    for _ in range(args.repeats):  # alternately, so that a drift of the machine's speed touches both
        rows["plain"].append(time_batches(DigitsMLP, args.trials, args.steps, args.warmup))
        rows["on_train_batch_end"].append(time_batches(KeepsItsLosses, args.trials, args.steps, args.warmup))
    print(f"{args.trials} digits MLPs (width 8) on vmap, one thread; ms per batch, median (thread CPU time)")
    print("| trial class | each repeat | median |")
    print("|---|---|---|")
    for name, values in rows.items():
        each = ", ".join(f"{1000 * v:.2f}" for v in values)
        print(f"| {name} | {each} | {1000 * statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
