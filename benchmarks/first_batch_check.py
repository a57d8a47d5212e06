"""How often the first-batch fusion check sees a float32 jump, and how often it (wrongly) reports one.

The wide MLP of issue 9 item 3 (hidden 1024, depth 4; B = 4 and 8 trials that differ only in lr) is fused on
vmap and trained one step, ``--runs`` times. Rounding sometimes flips a ReLU unit in one of the two float32
computations; the check then reruns the fused step in float64 and logs "vanishes" instead of raising.

    python benchmarks/first_batch_check.py --runs 9
"""

from __future__ import annotations

import argparse
import logging

import lightning as L
import torch

from lightning_hydro import FusedLightningModule, FusionMismatchError
from lightning_hydro.demos import DigitsDataModule, DigitsMLP


class _CountVanished(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "vanishes" in record.getMessage()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="repeats of the B = 4 and B = 8 groups")
    args = parser.parse_args()
    counter = _CountVanished()
    verify_log = logging.getLogger("lightning_hydro.fused.verify.fusion")
    verify_log.setLevel(logging.INFO)
    verify_log.addHandler(counter)
    reported = checks = 0
    for _ in range(args.runs):
        for size in (4, 8):
            trials = [DigitsMLP(hidden_dim=1024, depth=4, lr=0.01 * 1.5**i) for i in range(size)]
            fused = FusedLightningModule(trials, backend="vmap", summary=False)
            checks += 1
            try:
                quiet = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
                trainer = L.Trainer(max_steps=1, enable_model_summary=False, **quiet)  # type: ignore[arg-type]
                trainer.fit(fused, datamodule=DigitsDataModule(batch_size=64))
            except FusionMismatchError as error:
                reported += 1
                print(f"reported: {str(error)[:300]}")
    print(
        f"| checks | float32 jumps cleared by the float64 rerun | mismatches reported | threads |\n|---|---|---|---|\n"
        f"| {checks} | {counter.count} | {reported} | {torch.get_num_threads()} |"
    )


if __name__ == "__main__":
    main()
