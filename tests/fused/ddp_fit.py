"""Fit the DDP tests' fused group and write what each rank ends with (run by tests/fused/test_rank_sync.py).

``python tests/fused/ddp_fit.py OUT_DIR STRATEGY [MODE]``: with ``strategy=ddp`` Lightning re-runs this script for
rank 1; each rank writes ``OUT_DIR/rank<r>.pt`` (results and every trial's weights). ``MODE`` ``fail``: rank 1's
trials raise from the first training step after ASHA's first rung (step 5) on; ``nan``: the lr 0.3 trial's loss is NaN
on rank 1 alone at step 2 (the loop backend, which runs each trial's own code).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from lightning_hydro import FusedLightningModule
from lightning_hydro.callbacks import ASHA
from tests.fused.ddp_trials import (
    LEARNING_RATES,
    REFILL_RATES,
    DigitsData,
    FailingDigits,
    NanOnOneRank,
    trainer,
    trials,
)


def fit(out: Path, strategy: str, mode: str | None) -> None:
    group, refill = trials(LEARNING_RATES), trials(REFILL_RATES, first_seed=10)
    backend = "vmap"
    if mode == "fail":
        group, refill = (
            [FailingDigits(hidden_dim=8, lr=lr, fail_on_rank=1, fail_at=5) for lr in rates]
            for rates in (LEARNING_RATES, REFILL_RATES)
        )
    elif mode == "nan":
        group = [NanOnOneRank(hidden_dim=8, lr=lr, nan_on_rank=1, nan_at=2) for lr in LEARNING_RATES]
        refill, backend = [], "loop"
    fused = FusedLightningModule(group, backend=backend, summary=False)  # type: ignore[arg-type]
    asha = ASHA("val_loss", max_t=3, refill=refill or None)
    run = trainer(callbacks=[asha], strategy=strategy, devices=2)
    run.fit(fused, datamodule=DigitsData(32))
    weights = {tid: fused.unfuse(tid).state_dict() for tid in fused.results}
    torch.save({"results": fused.results, "weights": weights}, out / f"rank{run.global_rank}.pt")


if __name__ == "__main__":
    fit(Path(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
