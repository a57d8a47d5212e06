"""Trials whose layers carry ``torch.nn.utils.parametrizations`` (``weight_norm``, ``spectral_norm``).

``parametrize`` gives every changed module a class of its own (each trial's ``ParametrizedLinear`` is another class),
and holds the weight as ``parametrizations.weight.original0/original1``. ``weight_norm`` fuses on every backend
(hfta refused it before: "trials have {1: 'ParametrizedLinear', ...}"); ``spectral_norm``'s power iteration
writes its buffers with ``out=`` calls, which vmap cannot batch: it runs on the loop (``auto`` chooses it).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import StopTrialAt, fit_digits, max_state_difference, seeded, train_fused, train_separately

LRS = (0.05, 0.1, 0.2)


class NormalizedMLP(L.LightningModule):
    """A digits MLP whose hidden layer is weight- or spectrally normalized, as GAN and audio models write it."""

    def __init__(self, lr: float = 0.1, norm: str = "weight_norm") -> None:
        super().__init__()
        self.save_hyperparameters()
        normalize = getattr(nn.utils.parametrizations, norm)
        self.net = nn.Sequential(normalize(nn.Linear(64, 32)), nn.ReLU(), nn.Linear(32, 10))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)


def trials(norm: str) -> list[L.LightningModule]:
    lrs = iter(LRS)
    return seeded(lambda: NormalizedMLP(lr=next(lrs), norm=norm), range(len(LRS)))


@pytest.mark.parametrize(
    ("norm", "backend"),
    [("weight_norm", "vmap"), ("weight_norm", "hfta"), ("weight_norm", "loop"), ("spectral_norm", "auto")],
)
def test_parametrized_trials_train_as_alone_when_one_is_stopped(norm: str, backend: str) -> None:
    modules = trials(norm)
    kwargs: dict[str, Any] = dict(max_steps=10, limit_val_batches=0)
    alone = train_separately(modules, fit_digits, **kwargs)
    fused = train_fused(modules, fit_digits, fused_kwargs=dict(backend=backend), callbacks=[StopTrialAt(4)], **kwargs)
    assert fused.results[1]["status"] == "stopped"
    for trial_id in (0, 2):
        assert max_state_difference(fused.unfuse(trial_id), alone[trial_id]) <= 1e-5
