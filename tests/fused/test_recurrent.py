"""Trials with recurrent layers (``nn.LSTM``, ``nn.GRU``), written as published sequence models write them.

vmap has no batching rule for torch's recurrent kernels, so these trials run on the loop backend (``auto`` chooses
it; ``vmap`` and ``hfta`` refuse, naming the line). Each trial must train as alone, also when another trial is
stopped mid-fit: before, that stop crashed the group ("Output 1 of Unbind is a view and its base ... has been
modified inplace"), since the loop's ``functional_call`` leaves each recurrent layer holding the step's rows of the
stacked weights in ``_flat_weights``, and the trial's release of held graphs read those rows' ``grad_fn``.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn

from lightning_hydro.backends import FusionError
from tests.helpers import NextTokenLM, StopTrialAt, max_state_difference, seeded, train_fused, train_separately

LRS = (1e-2, 3e-3, 3e-2)


class RecurrentLM(NextTokenLM):
    """Embedding, a two-layer recurrent core (batch first), a linear readout; trained as the other token models."""

    def __init__(self, lr: float = 1e-2, cell: str = "lstm", hidden_dim: int = 16, vocab: int = 20) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, hidden_dim, padding_idx=0)
        recurrent = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.rnn = recurrent(hidden_dim, hidden_dim, num_layers=2, batch_first=True, bidirectional=cell == "gru")
        self.head = nn.Linear(hidden_dim * (2 if cell == "gru" else 1), vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out)


def fit(trainer: L.Trainer, module: L.LightningModule) -> None:
    trainer.fit(module)


def trials(cell: str) -> list[L.LightningModule]:
    lrs = iter(LRS)
    return seeded(lambda: RecurrentLM(lr=next(lrs), cell=cell), range(len(LRS)))


@pytest.mark.parametrize("backend", ["loop", "auto"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_recurrent_trials_train_as_alone_when_one_is_stopped_mid_fit(cell: str, backend: str) -> None:
    modules = trials(cell)
    alone = train_separately(modules, fit, max_steps=12)
    alone_until_stop = train_separately(modules[1:2], fit, max_steps=5)[0]
    fused = train_fused(modules, fit, fused_kwargs=dict(backend=backend), callbacks=[StopTrialAt(5)], max_steps=12)
    assert fused.results[1]["status"] == "stopped"
    assert max_state_difference(fused.unfuse(1), alone_until_stop) == 0.0
    for trial_id in (0, 2):
        assert max_state_difference(fused.unfuse(trial_id), alone[trial_id]) == 0.0


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_vectorised_backends_refuse_a_recurrent_layer_naming_its_line(backend: str) -> None:
    line = r"test_recurrent\.py:\d+ in forward: out, _ = self\.rnn\(self\.embed\(tokens\)\)"
    with pytest.raises(FusionError, match=rf"{line}.*aten::lstm.*Use backend='loop'"):
        train_fused(trials("lstm"), fit, fused_kwargs=dict(backend=backend), max_steps=1)
