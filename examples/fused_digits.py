"""Sixteen learning rates, one model: a fused sweep of MLP trials on scikit-learn's digits.

Every trial is an ordinary, unmodified LightningModule (``DigitsMLP``); ``FusedLightningModule`` stacks
their parameters and trains all sixteen with one vectorised forward/backward per batch, each with its
own optimizer. At the end it prints a per-trial table and the best trial, then exports that trial as a
standalone module.

Run::

    python examples/fused_digits.py                  # 16 trials, 10 epochs, backend chosen by timing
    python examples/fused_digits.py --epochs 3 --trials 8 --backend vmap
    python examples/fused_digits.py --compile on    # each steady step as one torch.compile'd function
"""

from __future__ import annotations

import argparse

import lightning as L
import numpy as np

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP


def main(argv: list[str] | None = None) -> dict[int, dict]:
    """Train the trials fused, print the table and the best trial, and return `fused.results`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16, help="number of learning rates to try")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--backend", default="auto", choices=["auto", "vmap", "loop", "hfta"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--compile",
        default="off",
        choices=["off", "on", "reduce-overhead"],
        help="torch.compile the fused step (reduce-overhead: also as a CUDA graph on a GPU)",
    )
    args = parser.parse_args(argv)

    L.seed_everything(args.seed, verbose=False)
    learning_rates = np.logspace(-3, 0, args.trials)  # 1e-3 ... 1, log-spaced
    trials = [DigitsMLP(hidden_dim=args.hidden_dim, lr=float(lr), momentum=0.9) for lr in learning_rates]

    compile = {"off": False, "on": True, "reduce-overhead": "reduce-overhead"}[args.compile]
    fused = FusedLightningModule(trials, backend=args.backend, monitor="val_acc", mode="max", compile=compile)
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="auto",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(fused, datamodule=DigitsDataModule(batch_size=64, seed=args.seed))

    results = fused.results
    best = max(results, key=lambda tid: results[tid]["metrics"].get("val_acc", float("-inf")))
    print(
        f"\nbest trial: {best} (lr={learning_rates[best]:.4g}) "
        f"val_acc={results[best]['metrics']['val_acc']:.4f} after {results[best]['budget']} epochs"
    )
    if compile:
        print(fused.compile_report)  # how many steps ran compiled, their checks, and anything that ran eagerly
    model = fused.unfuse(best)  # an ordinary DigitsMLP with the trained weights, ready to use or save
    print(f"unfused: a standalone {type(model).__name__} with {sum(p.numel() for p in model.parameters())} parameters")
    return results


if __name__ == "__main__":
    main()
