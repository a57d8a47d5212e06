"""Fit the DDP tests' fused group and write what each rank ends with (run by tests/fused/test_rank_sync.py).

``python tests/fused/ddp_fit.py OUT_DIR STRATEGY [FAIL_ON_RANK]``: with ``strategy=ddp`` Lightning re-runs this script
for rank 1; each rank writes ``OUT_DIR/rank<r>.pt`` (results and every trial's weights). ``FAIL_ON_RANK``: that rank's
trials raise from the first training step after ASHA's first rung (step 5) on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from lightning_hydro import FusedLightningModule
from lightning_hydro.callbacks import ASHA
from tests.fused.ddp_trials import LEARNING_RATES, REFILL_RATES, DigitsData, FailingDigits, trainer, trials


def fit(out: Path, strategy: str, fail_on_rank: int | None) -> None:
    group, refill = trials(LEARNING_RATES), trials(REFILL_RATES, first_seed=10)
    if fail_on_rank is not None:
        group, refill = (
            [FailingDigits(hidden_dim=8, lr=lr, fail_on_rank=fail_on_rank, fail_at=5) for lr in rates]
            for rates in (LEARNING_RATES, REFILL_RATES)
        )
    fused = FusedLightningModule(group, backend="vmap", summary=False)
    asha = ASHA("val_loss", max_t=3, refill=refill)
    run = trainer(callbacks=[asha], strategy=strategy, devices=2)
    run.fit(fused, datamodule=DigitsData(32))
    weights = {tid: fused.unfuse(tid).state_dict() for tid in fused.results}
    torch.save({"results": fused.results, "weights": weights}, out / f"rank{run.global_rank}.pt")


if __name__ == "__main__":
    fit(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
