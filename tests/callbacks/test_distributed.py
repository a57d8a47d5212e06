"""Two real DDP ranks (CPU, gloo): rank zero decides, both ranks stop together, the store sees one report."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
from lightning.pytorch.callbacks import Callback

from lightning_hydro.callbacks import ASHA
from lightning_hydro.demos import DigitsDataModule
from lightning_hydro.stopping import open_store
from tests.callbacks.trials import mlp
from tests.helpers import make_trainer


class WhereEachRankStopped(Callback):
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        asha = next(c for c in trainer.callbacks if isinstance(c, ASHA))
        record = {
            "epoch": trainer.current_epoch,
            "status": asha.status,
            "reason": asha.endings[asha._view.key].reason,
        }
        (self.directory / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


@pytest.mark.slow
def test_two_ranks_stop_together_on_rank_zeros_decision(tmp_path):
    storage = str(tmp_path / "rungs.db")
    # an earlier, better trial at the first rung, so that this one is stopped there
    good = ASHA("val_loss", max_t=3, storage=storage, trial_id="good")
    make_trainer(max_epochs=3, callbacks=[good], limit_train_batches=3, limit_val_batches=1).fit(
        mlp(0.3), datamodule=DigitsDataModule()
    )
    callback = ASHA("val_loss", max_t=3, storage=storage, trial_id="ddp")
    trainer = make_trainer(
        max_epochs=3,
        callbacks=[callback, WhereEachRankStopped(tmp_path)],
        strategy="ddp_spawn",
        devices=2,
        limit_train_batches=3,
        limit_val_batches=1,
    )
    trainer.fit(mlp(0.0001), datamodule=DigitsDataModule())
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0] == ranks[1]  # the same decision applied on both ranks
    assert (ranks[0]["epoch"], ranks[0]["status"]) == (1, "stopped")
    assert ranks[0]["reason"].startswith("ASHA rung 0 (budget 1): val_loss")
    records = open_store(storage).records()
    assert [(r.trial_id, r.milestone) for r in records].count(("ddp", 1)) == 1  # reported once, by rank zero


class FailingRule(ASHA):
    def _judge(self, reports, *, together):
        raise ValueError("the rung store is unreachable")


def fake_trainer(rank: int, received=None):
    broadcasts = []

    def broadcast(obj, src=0):
        broadcasts.append(obj)
        return obj if received is None else received

    strategy = SimpleNamespace(broadcast=broadcast)
    return SimpleNamespace(world_size=2, is_global_zero=rank == 0, strategy=strategy), broadcasts


def test_a_decision_failing_on_rank_zero_is_raised_on_every_rank_not_waited_for():
    callback = FailingRule("val_loss")
    trainer, sent = fake_trainer(0)
    with pytest.raises(ValueError, match="the rung store is unreachable"):
        callback._on_rank_zero(trainer, lambda: callback._judge([], together=True))
    assert sent == [(None, "ValueError: the rung store is unreachable")]  # the other ranks hear of it
    other, _ = fake_trainer(1, received=sent[0])
    with pytest.raises(RuntimeError, match=r"FailingRule: the decision on rank 0 failed \(ValueError: the rung store"):
        callback._on_rank_zero(other, lambda: pytest.fail("rank 1 does not decide"))
    ok, _ = fake_trainer(1, received=([3], None))
    assert callback._on_rank_zero(ok, lambda: pytest.fail("rank 1 does not decide")) == [3]
