"""ASHA in a real Trainer: a fused group (equal to synchronous halving; refilled slots), and one trial per process."""

from __future__ import annotations

import math
import os

import torch
from lightning.pytorch.callbacks import Callback

from lightning_hydro.callbacks import ASHA, DEFAULT_STORE_FILE, SuccessiveHalving
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.stopping import AsyncSuccessiveHalving, HalvingConfig, open_store
from tests.callbacks.trials import LEARNING_RATES, GroupProbe, fit, fused, mlp, mlps


def outcome_table(module):
    return {tid: (r["status"], r["epochs"]) for tid, r in module.results.items()}


def test_on_a_group_that_starts_together_asha_cuts_as_synchronous_halving():
    asha_module, halving_module = fused(LEARNING_RATES), fused(LEARNING_RATES)
    fit(asha_module, [ASHA("val_loss", max_t=3)], max_epochs=3)
    fit(halving_module, [SuccessiveHalving("val_loss", max_t=3)], max_epochs=3)
    assert outcome_table(asha_module) == outcome_table(halving_module)
    assert sorted(status for status, _ in outcome_table(asha_module).values()).count("stopped") == 6


def test_freed_slots_are_refilled_at_once_and_budgets_count_from_entry():
    module, probe = fused(LEARNING_RATES[:3]), GroupProbe()
    refills = mlps([0.2, 0.05, 0.002, 0.1])
    callback = ASHA("val_loss", grace_period=1, reduction_factor=3, max_t=3, refill=refills)
    fit(module, [callback, probe], max_epochs=4)

    assert sorted(module.results) == list(range(7))  # the 4 new trials got ids 3..6
    assert max(probe.rows) == 3
    assert all(rows == len(ids) for rows, ids in zip(probe.rows, probe.trial_ids))
    joined = {tid: next(epoch for epoch, ids in enumerate(probe.trial_ids) if tid in ids) for tid in module.results}
    assert joined[0] == joined[1] == joined[2] == 0
    assert joined[3] == 1
    for tid, result in module.results.items():
        last = max(epoch for epoch, ids in enumerate(probe.trial_ids) if tid in ids)
        assert result["epochs"] == last - joined[tid] + 1  # counted from when it entered its slot
    # the first cut happened at once: the group never ran an epoch with a free slot while trials were pending
    assert probe.rows[:2] == [3, 3]
    assert callback._refill.drawn == 4
    assert callback._refill.exhausted
    # a trial refilled later is judged against everything recorded at its rung before it
    rung_zero = [record.trial_id for record in callback.rule.records() if record.milestone == 1]
    assert rung_zero[:3] == [0, 1, 2]
    assert set(rung_zero) == set(range(7))
    assert all(status in ("completed", "stopped") for status, _ in outcome_table(module).values())


def test_a_group_emptied_by_its_decisions_goes_on_with_its_refills():
    module = fused([0.1])
    fit(module, [ASHA("val_loss", max_t=1, refill=mlps([0.2, 0.3]))], max_epochs=3)
    assert outcome_table(module) == {0: ("completed", 1), 1: ("completed", 1), 2: ("completed", 1)}


def test_refill_from_a_factory_called_with_the_trial_index():
    calls: list[int] = []

    def factory(index: int) -> DigitsMLP | None:
        calls.append(index)
        return mlp(0.05 * (index + 1)) if index < 2 else None

    module = fused(LEARNING_RATES[:3])
    fit(module, [ASHA("val_loss", max_t=2, refill=factory)], max_epochs=3)
    assert calls[:3] == [0, 1, 2]
    assert len(module.results) == 5


def test_one_trial_per_process_shares_a_sqlite_file_and_fit_ends_normally(tmp_path):
    storage = f"sqlite:///{tmp_path / 'asha.db'}"
    runs = [("good", 0.3), ("fair", 0.1), ("hopeless", 0.0001)]
    callbacks = {}
    for name, lr in runs:
        callbacks[name] = ASHA("val_loss", max_t=3, storage=storage, namespace="sweep", trial_id=name)
        trainer = fit(mlp(lr), [callbacks[name]], max_epochs=3)
        callbacks[name].epochs_run = trainer.current_epoch
    good, hopeless = callbacks["good"], callbacks["hopeless"]
    assert (good.status, good.result["budget"], good.result["reason"]) == ("completed", 3, "reached max_t=3")
    assert hopeless.status == "stopped"
    assert hopeless.epochs_run == 1
    assert hopeless.result["rung"] == 0
    assert hopeless.result["reason"].startswith("ASHA rung 0 (budget 1): val_loss")
    assert set(hopeless.result) == {"trial_id", "status", "budget", "epochs", "steps", "metrics", "reason", "rung"}
    assert "Trial hopeless: stopped at budget 1: ASHA rung 0" in hopeless.summary

    # every report is in the shared file, and the decisions are those of one process replaying them in order
    records = open_store(storage, namespace="sweep").records()
    reference = AsyncSuccessiveHalving(HalvingConfig("min", 1, 3, 3))
    replayed = {(r.trial_id, r.milestone): reference.report(r.trial_id, r.budget, r.value).action for r in records}
    assert replayed[("hopeless", 1)] == "stop"
    assert replayed[("good", 3)] == "complete"
    assert {callbacks[name].status for name, _ in runs} == {"completed", "stopped"}


def test_the_default_storage_is_a_sqlite_file_in_the_default_root_dir(tmp_path):
    callback = ASHA("val_loss", max_t=2, trial_id="only")
    fit(mlp(0.1), [callback], max_epochs=2, default_root_dir=str(tmp_path))
    assert os.path.exists(tmp_path / DEFAULT_STORE_FILE)
    assert callback.rule.store.location == str(tmp_path / DEFAULT_STORE_FILE)
    assert [(r.trial_id, r.milestone) for r in callback.rule.records()] == [("only", 1)]  # rungs: 1 (3 > max_t)


class NaNValidation(DigitsMLP):
    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.tensor(math.nan))


def test_a_non_finite_monitor_stops_the_trial_as_diverged(tmp_path):
    callback = ASHA("val_loss", max_t=3, storage=str(tmp_path / "rungs.db"))
    torch.manual_seed(0)
    trainer = fit(NaNValidation(hidden_dim=8), [callback], max_epochs=3)
    assert (callback.status, trainer.current_epoch) == ("diverged", 1)
    assert callback.result["reason"] == "val_loss is nan (diverged)"


class TrainModes(Callback):
    """Records, at every training batch, whether every running trial module is in train mode."""

    def __init__(self) -> None:
        self.all_training: list[bool] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.all_training.append(all(pl_module.trial_module(t).training for t in pl_module.trial_ids))


def test_trials_refilled_after_validation_train_in_train_mode(caplog):
    module, modes = fused(LEARNING_RATES[:3]), TrainModes()
    callback = ASHA("val_loss", max_t=2, refill=mlps([0.2, 0.05]), verbose=True)
    with caplog.at_level("INFO", logger="lightning.pytorch.utilities.rank_zero"):
        fit(module, [callback, modes], max_epochs=2)
    assert 3 in module.results  # a trial was refilled at the end of the first validation...
    assert all(modes.all_training)  # ...and trained in train mode, although it joined while the group was in eval
    assert "ASHA: trial 3 fills a free slot." in caplog.text
    assert "ASHA: trial 2 completed at budget 2: reached max_t=2." in caplog.text
    assert "ASHA: trial 0 stopped at budget 1: ASHA rung 0 (budget 1): val_loss" in caplog.text
