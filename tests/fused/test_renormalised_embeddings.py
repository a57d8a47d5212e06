"""``nn.Embedding(max_norm=...)``: the forward renormalises the looked-up rows of its weight in place.

Before, the loop ran each trial on ``unbind`` views of the stacked weight, which torch forbids writing in place
("Output 0 of UnbindBackward0 is a view and its base or another view of its base has been modified inplace"), and
``auto`` let that error through, although vmap and hfta train the model.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from lightning_hydro.backends.errors import FusionError
from tests.helpers import fit_plain, max_state_difference, seeded, token_data, train_fused, train_separately

TOLERANCE = {"loop": 0.0, "vmap": 1e-5, "hfta": 1e-5, "auto": 1e-5}


class RenormalisedLM(L.LightningModule):
    """Next-token model whose embedding keeps its rows' norms at most ``max_norm``; ``tied``: readout = embedding."""

    def __init__(self, lr: float = 0.05, max_norm: float | None = 1.0, tied: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(20, 16, max_norm=max_norm)
        self.mix = nn.Linear(16, 16)
        self.readout = nn.Linear(16, 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.mix(self.embed(x)))
        return hidden @ self.embed.weight.T if self.hparams["tied"] else self.readout(hidden)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=0)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:  # renormalises in evaluation too
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=0))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(token_data(num=96), batch_size=32)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(token_data(num=32, seed=1), batch_size=32)


def _train_and_compare(backend: str, settings: list[dict[str, Any]]) -> None:
    kwargs = iter(settings)
    modules = seeded(lambda: RenormalisedLM(**next(kwargs)), range(len(settings)))
    alone = train_separately(modules, fit_plain, max_epochs=2)
    fused = train_fused(modules, fit_plain, fused_kwargs=dict(backend=backend), max_epochs=2)
    for trial_id, setting in enumerate(settings):
        trained = fused.unfuse(trial_id)
        assert max_state_difference(trained, alone[trial_id]) <= TOLERANCE[backend], trial_id
        if setting.get("max_norm") is not None:
            assert trained.embed.weight.norm(dim=1).max() <= setting["max_norm"] * (1 + 1e-5)  # renormalised


@pytest.mark.parametrize("backend", ["loop", "vmap", "hfta", "auto"])
def test_an_embedding_with_max_norm_trains_as_alone(backend: str) -> None:
    _train_and_compare(backend, [dict(lr=0.05), dict(lr=0.2), dict(lr=0.5)])


@pytest.mark.parametrize("backend", ["loop", "auto"])
def test_a_renormalised_embedding_tied_to_the_readout_trains_as_alone(backend: str) -> None:
    # the readout reads the weight the trials' renormalisation wrote: each trial must see its own row as alone
    _train_and_compare(backend, [dict(lr=0.05, tied=True), dict(lr=0.2, tied=True), dict(lr=0.5, tied=True)])


def test_trials_with_different_max_norms_train_as_alone_on_the_loop() -> None:
    _train_and_compare("loop", [dict(lr=0.05, max_norm=1.0), dict(lr=0.2, max_norm=None), dict(lr=0.5, max_norm=0.5)])


class FunctionalRenormLM(RenormalisedLM):
    """Renormalises a plain parameter with ``F.embedding(..., max_norm=1.0)``: no module says that it writes."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__(lr, max_norm=None)
        self.table = nn.Parameter(torch.randn(20, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.readout(torch.tanh(self.mix(F.embedding(x, self.table, max_norm=1.0))))


def test_a_functional_in_place_write_of_a_parameter_is_refused_on_the_loop_and_auto_fuses_it() -> None:
    lrs = iter((0.05, 0.2))
    modules = seeded(lambda: FunctionalRenormLM(next(lrs)), range(2))
    with pytest.raises(FusionError, match=r"writes a parameter in place .*F\.embedding.* backend='vmap'"):
        train_fused(modules, fit_plain, fused_kwargs=dict(backend="loop"), max_epochs=1)
    alone = train_separately(modules, fit_plain, max_epochs=2)
    fused = train_fused(modules, fit_plain, fused_kwargs=dict(backend="auto"), max_epochs=2)
    assert fused.backend in ("vmap", "hfta")  # the loop refused it
    for trial_id in range(2):
        assert max_state_difference(fused.unfuse(trial_id), alone[trial_id]) <= TOLERANCE["auto"]
