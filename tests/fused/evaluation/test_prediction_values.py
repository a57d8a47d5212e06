"""A prediction that holds Python values beside its tensors comes back whole for each trial, on every backend.

Under vmap and hfta one template runs ``predict_step`` for every trial and vmap returns tensors only: the dict's
other values (the loader's index, the batch's, a tag) were dropped before (the loop kept them, as alone).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Subset

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from tests.helpers import make_trainer


class TaggedPredictions(DigitsMLP):
    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        x, _ = batch
        return {"logits": self(x), "loader": dataloader_idx, "batch_idx": batch_idx, "tag": "digits"}


def loaders() -> list[DataLoader]:
    data = DigitsDataModule()
    data.setup()
    assert data.val_set is not None
    return [
        DataLoader(Subset(data.val_set, range(0, 40)), batch_size=20),
        DataLoader(Subset(data.val_set, range(40, 56)), batch_size=16),
    ]


@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop"])
def test_each_trials_prediction_holds_its_tensors_and_the_steps_other_values_as_alone(backend: str) -> None:
    trials = []
    for seed, lr in enumerate((0.05, 0.2, 0.5)):
        torch.manual_seed(seed)
        trials.append(TaggedPredictions(lr=lr, hidden_dim=16))
    alone = [make_trainer().predict(copy.deepcopy(t), dataloaders=loaders()) for t in trials]
    fused = FusedLightningModule(copy.deepcopy(trials), backend=backend, summary=False)
    predictions = make_trainer().predict(fused, dataloaders=loaders())
    for loader, batches in enumerate(predictions):
        for batch_idx, by_trial in enumerate(batches):
            for tid, mine in by_trial.items():
                own = alone[tid][loader][batch_idx]
                assert list(mine) == list(own)  # the keys, in the step's order
                assert (mine["loader"], mine["batch_idx"], mine["tag"]) == (loader, batch_idx, "digits")
                torch.testing.assert_close(mine["logits"], own["logits"], rtol=1e-5, atol=1e-6)
