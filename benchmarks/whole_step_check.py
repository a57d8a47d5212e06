"""How close are each model's first compiled whole steps to the same steps run eagerly? (issue 22)

With ``compile=True`` a steady fused step runs as one compiled function (``lightning_hydro.fused.step.whole_step``).
The first three whole steps of each fused update are run twice, compiled and eagerly from the same state, and
compared group by group (the parameters, the buffers, each optimizer state); the eager result is kept, and a
difference over the bound makes every later step run eagerly. The split step's compiled forward and backward are
checked the same way at their first three calls (``compiled_step.CompiledStep``: losses, gradients, buffers). This
script fits a few small fused groups (3 trials, 6 steps) under ``compile=True`` and prints, per model, what both
checks measured: the largest error of their checks, in units of what float rounding allows (<= 1: the same step;
for the whole step the bound is ``WHOLE_CHECK_RELATIVE`` of each group's change plus 1e-6 of its size), or why
they did not compare. The whole step runs in 32- and 64-bit precision only; under ``bf16-mixed`` only the split
step is compiled.

``--no-left-out`` runs the check without leaving out the parameter elements whose gradient is rounding noise (see
``whole_step._noise``): then Adam's steps on such elements (a bias feeding BatchNorm) read as errors.

Run::

    python benchmarks/whole_step_check.py                    # on CUDA if present, else the CPU
    python benchmarks/whole_step_check.py --models cnn-adam --no-left-out
    python benchmarks/whole_step_check.py --backend hfta                     # hfta's operators, compiled as torch's
"""

from __future__ import annotations

import argparse
import copy
import datetime
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' model zoo

from compile_step import TemplateNetTrial  # the template's SimpleDenseNet, Adam

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.demos.digits import DigitsDataModule
from lightning_hydro.fused.step import whole_step
from tests.helpers import DigitsCNN, TiedAttentionLM, TinyAttentionLM, make_trainer, seeded


class CNNAdam(DigitsCNN):
    """The BatchNorm CNN (convolutions with a bias, feeding BatchNorm) with Adam."""

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.hparams["lr"] * 0.1)


class TorchAttention(L.LightningModule):
    """Rows of the digits as 8 tokens through ``nn.MultiheadAttention`` (its key bias included), AdamW."""

    def __init__(self, lr: float, dropout: float = 0.0) -> None:
        super().__init__()
        self.lr = lr
        self.proj = nn.Linear(8, 32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True, dropout=dropout)
        self.head = nn.Linear(32, 10)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        h = self.proj(x.view(-1, 8, 8))
        attended, _ = self.attn(h, h, h, need_weights=False)
        loss = F.cross_entropy(self.head(attended.mean(1)), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def _digits(trainer: L.Trainer, module: L.LightningModule) -> None:
    trainer.fit(module, datamodule=DigitsDataModule())


def _own(trainer: L.Trainer, module: L.LightningModule) -> None:
    trainer.fit(module)


# name -> (trial i's module, how it is fitted)
MODELS: dict[str, tuple[Callable[[int], L.LightningModule], Callable[[L.Trainer, L.LightningModule], None]]] = {
    "mlp-sgd": (lambda i: DigitsMLP(hidden_dim=32, lr=0.05 * (i + 1)), _digits),
    "mlp-adam": (lambda i: DigitsMLP(hidden_dim=32, lr=1e-3 * (i + 1), optimizer="adam"), _digits),
    "mlp-adamw": (lambda i: DigitsMLP(hidden_dim=32, lr=3e-3 * (i + 1), optimizer="adamw", weight_decay=0.01), _digits),
    "mlp-dropout": (lambda i: DigitsMLP(hidden_dim=32, lr=0.05 * (i + 1), dropout=0.2), _digits),
    "cnn-sgd": (lambda i: DigitsCNN(lr=0.02 * (i + 1)), _digits),
    "cnn-adam": (lambda i: CNNAdam(lr=0.02 * (i + 1)), _digits),
    "densenet-adam": (lambda i: TemplateNetTrial(lr=1e-3 * (i + 1)), _digits),
    "attention-adamw": (lambda i: TinyAttentionLM(lr=1e-3 * (i + 1)), _own),
    "tied-adamw": (lambda i: TiedAttentionLM(lr=1e-3 * (i + 1)), _own),
    "mha-adamw": (lambda i: TorchAttention(lr=1e-3 * (i + 1)), _digits),
}


def check(name: str, clip: float | None, accelerator: str, precision: str, backend: str = "vmap") -> str:
    """One fused fit of ``name``'s 3 trials; its check's table row."""
    make, fit = MODELS[name]
    trials = [seeded(lambda i=i: make(i), [i])[0] for i in range(3)]
    fused = FusedLightningModule([copy.deepcopy(t) for t in trials], backend=backend, compile=True, summary=False)
    trainer = make_trainer(
        max_steps=6, accelerator=accelerator, gradient_clip_val=clip, precision=precision, limit_val_batches=0
    )
    fit(trainer, fused)
    whole = fused._training_step.whole
    if not whole.checks:
        measured = f"not checked: {whole.reason}"
    elif whole.unchecked:
        measured = "not compared: random numbers"
    else:
        measured = f"{whole.worst:.2g}"
    split = fused._training_step.policy.backend.compiled_step
    if split is None or not split.checks:
        first = "not checked" if split is None else f"not checked: {split.failure}"
    elif split.unchecked:
        first = "not compared: random numbers"
    else:
        first = f"{split.worst:.2g}"
    failure = whole.failure or (split.failure if split is not None else "")
    return f"| {name} | {precision} | {clip or ''} | {first} | {measured} | {whole.whole_steps} of 6 | {failure} |"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--clip", nargs="+", type=float, default=[0.0, 0.05], help="gradient_clip_val (0: none)")
    parser.add_argument("--accelerator", default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", nargs="+", default=["32-true"], help="e.g. 32-true bf16-mixed")
    parser.add_argument("--no-left-out", action="store_true", help="compare noise-gradient elements too")
    parser.add_argument("--backend", choices=("vmap", "hfta"), default="vmap")
    args = parser.parse_args(argv)
    if args.no_left_out:
        whole_step._noise = lambda update, grads: {}  # type: ignore[assignment]
    torch.manual_seed(0)
    device = torch.cuda.get_device_name(0) if args.accelerator == "gpu" else "CPU"
    print(
        f"Device: {device}, torch {torch.__version__}, Lightning {L.__version__}, {datetime.date.today()}; "
        f"backend {args.backend}; bound: {whole_step.WHOLE_CHECK_RELATIVE} of each group's change"
        f"{'; noise-gradient elements compared too' if args.no_left_out else ''}.\n"
    )
    print(
        "| model | precision | clip | split step's first compiled calls: error / bound | first whole steps' error / "
        "bound | steps whole | failure |"
    )
    print("|---|---|---|---|---|---|---|")
    for precision in args.precision:
        for name in args.models:
            for clip in args.clip:
                print(check(name, clip or None, args.accelerator, precision, args.backend), flush=True)
    print(f"\nCommand: `python benchmarks/whole_step_check.py {' '.join(argv or sys.argv[1:])}`")


if __name__ == "__main__":
    main()
