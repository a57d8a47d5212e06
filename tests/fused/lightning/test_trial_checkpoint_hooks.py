"""The trials' own ``on_save_checkpoint`` / ``on_load_checkpoint`` keep their Python state in a group checkpoint.

Alone, a module keeps Python state through these hooks (a step counter, a list of epoch losses, as Lightning's docs
show) and gets it back on resume. Before, the group checkpoint called neither hook of the trials: resumed 2 + 2
epochs, a trial counted 8 steps where alone it counts 16, its loss list held the resumed epochs only, its
``on_load_checkpoint`` ran 0 times (alone once), and a trial stopped before the checkpoint came back with empty
attributes ((0, []) where alone it has (3, [loss])).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends.errors import FusionError
from lightning_hydro.demos import DigitsMLP
from tests.helpers import StopTrialAt, fit_digits, make_trainer, max_state_difference, seeded

LRS = (0.05, 0.2, 0.5)
SHORT = dict(limit_train_batches=4, limit_val_batches=2)


class CountingMLP(DigitsMLP):
    """Keeps a step count and each epoch's last loss through its checkpoint hooks."""

    def __init__(self, lr: float = 0.05, **digits: Any) -> None:
        super().__init__(lr=lr, **{"hidden_dim": 16, **digits})
        self.steps_seen = 0
        self.epoch_losses: list[float] = []
        self.loads = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.steps_seen += 1
        self.last_loss = loss.detach()
        return loss

    def on_train_epoch_end(self) -> None:
        self.epoch_losses.append(float(self.last_loss))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["counts"] = {"steps_seen": self.steps_seen, "epoch_losses": list(self.epoch_losses)}
        checkpoint["saved_at"] = (checkpoint["epoch"], checkpoint["global_step"], checkpoint["hyper_parameters"]["lr"])

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.steps_seen = checkpoint["counts"]["steps_seen"]
        self.epoch_losses = list(checkpoint["counts"]["epoch_losses"])
        self.saved_at = checkpoint["saved_at"]
        self.loads += 1


def trials() -> list[CountingMLP]:
    return [seeded(lambda lr=lr: CountingMLP(lr), [100 + i])[0] for i, lr in enumerate(LRS)]


def python_state(module: CountingMLP) -> tuple[int, list[float], int]:
    return module.steps_seen, module.epoch_losses, module.loads


def fit(module: L.LightningModule, epochs: int, callbacks: Sequence[Any] = (), **kwargs: Any) -> L.Trainer:
    torch.manual_seed(1234)
    trainer = make_trainer(max_epochs=epochs, callbacks=list(callbacks), **SHORT)
    fit_digits(trainer, module, batch_size=32, **kwargs)
    return trainer


def two_plus_two(module: L.LightningModule, fresh: L.LightningModule, path: Any) -> L.LightningModule:
    fit(module, 2).save_checkpoint(path)
    fit(fresh, 4, ckpt_path=path)
    return fresh


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[CountingMLP]]:
    root = tmp_path_factory.mktemp("alone")
    straight = trials()
    for module in straight:
        fit(module, 4)
    resumed = [two_plus_two(m, f, root / f"{i}.ckpt") for i, (m, f) in enumerate(zip(trials(), trials()))]
    return {"straight": straight, "resumed": resumed}


def assert_same_python_state(fused: CountingMLP, alone: CountingMLP, backend: str) -> None:
    rel = 0.0 if backend == "loop" else 1e-5  # vmap's losses round differently
    assert fused.steps_seen == alone.steps_seen
    assert fused.epoch_losses == pytest.approx(alone.epoch_losses, rel=rel, abs=0.0)
    assert fused.loads == alone.loads


@pytest.mark.parametrize("backend", ["loop", "vmap", "hfta"])
def test_resumed_trials_keep_their_hooks_python_state(tmp_path, alone, backend):
    kwargs = {"backend": backend, "summary": False}
    fused = two_plus_two(
        FusedLightningModule(trials(), **kwargs), FusedLightningModule(trials(), **kwargs), tmp_path / "mid.ckpt"
    )
    for tid in range(3):
        module = fused.trial_module(tid)
        assert python_state(alone["resumed"][tid])[:2] == python_state(alone["straight"][tid])[:2]
        assert_same_python_state(module, alone["resumed"][tid], backend)
        assert module.saved_at == alone["resumed"][tid].saved_at == (2, 8, LRS[tid])  # Lightning's keys, its lr
        assert max_state_difference(module, alone["resumed"][tid]) <= (0.0 if backend == "loop" else 1e-5)


def test_a_trial_stopped_before_the_checkpoint_comes_back_with_its_python_state(tmp_path):
    stopped_alone = seeded(lambda: CountingMLP(LRS[1]), [101])[0]
    torch.manual_seed(1234)

    class StopAlone(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
            trainer.should_stop = trainer.should_stop or trainer.global_step == 3

    fit(stopped_alone, 2, callbacks=[StopAlone()])
    checkpoints = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    torch.manual_seed(1234)
    trainer = make_trainer(max_epochs=2, callbacks=[StopTrialAt(3), checkpoints], enable_checkpointing=True, **SHORT)
    fit_digits(trainer, FusedLightningModule(trials(), backend="loop", summary=False), batch_size=32)
    resumed = FusedLightningModule(trials(), backend="loop", summary=False)
    fit(resumed, 3, ckpt_path=tmp_path / "last.ckpt")

    assert resumed.results[1]["status"] == "stopped"
    assert python_state(resumed.trial_module(1))[:2] == python_state(stopped_alone)[:2]
    assert stopped_alone.steps_seen == 3
    assert len(stopped_alone.epoch_losses) == 1  # its epoch ended at the stop
    assert resumed.trial_module(1).loads == 1  # restored from the checkpoint, as load_from_checkpoint would
    assert resumed.trial_module(0).steps_seen == 12  # the running trials go on counting


def test_a_group_built_from_its_checkpoint_gets_each_trials_state(tmp_path):
    fused = FusedLightningModule(trials(), backend="loop", summary=False)
    fit(fused, 2).save_checkpoint(tmp_path / "group.ckpt")
    loaded = FusedLightningModule.load_group_checkpoint(tmp_path / "group.ckpt", backend="loop", summary=False)
    for tid in range(3):
        expected = python_state(fused.trial_module(tid))[:2]
        assert python_state(loaded.unfuse(tid)) == (*expected, 1)  # as CountingMLP.load_from_checkpoint


def test_an_older_group_checkpoint_without_the_trials_entries_still_resumes(tmp_path):
    fit(FusedLightningModule(trials(), backend="loop", summary=False), 2).save_checkpoint(tmp_path / "mid.ckpt")
    checkpoint = torch.load(tmp_path / "mid.ckpt", weights_only=False)
    del checkpoint["lightning_hydro"]["trial_checkpoints"]
    torch.save(checkpoint, tmp_path / "old.ckpt")
    resumed = FusedLightningModule(trials(), backend="loop", summary=False)
    with pytest.warns(UserWarning, match=r"written before .* on_load_checkpoint of trials 0, 1, 2 is not called"):
        fit(resumed, 3, ckpt_path=tmp_path / "old.ckpt")
    assert (resumed.trial_module(0).steps_seen, resumed.trial_module(0).loads) == (4, 0)  # as before: not restored


def test_trials_without_the_hooks_add_nothing():
    fused = FusedLightningModule(seeded(lambda: DigitsMLP(hidden_dim=8), [0, 1]), backend="loop", summary=False)
    fit(fused, 1)
    checkpoint = {"epoch": 0, "global_step": 4}
    fused.on_save_checkpoint(checkpoint)
    assert checkpoint["lightning_hydro"]["trial_checkpoints"] == {}


class ReadsWeights(CountingMLP):
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["norm"] = float(checkpoint["state_dict"]["net.0.weight"].norm())


def test_a_hook_that_reads_the_groups_entries_is_told_where_they_are():
    fused = FusedLightningModule([ReadsWeights(), ReadsWeights(0.2)], backend="loop", summary=False)
    fit(fused, 1)
    expected = r"ReadsWeights.on_save_checkpoint of trial 0 reads checkpoint\['state_dict'\], which a fused group's"
    with pytest.raises(FusionError, match=expected):
        fused.on_save_checkpoint({"epoch": 0, "global_step": 4})
