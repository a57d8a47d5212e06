"""What every callback shares: argument errors, Trainer checks, monitor checks, decision points, state, ranks."""

from __future__ import annotations

import pytest
from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_hydro.callbacks import ASHA, Deadline, Hyperband, SuccessiveHalving
from lightning_hydro.stopping import StoreOpenError
from tests.callbacks.trials import LEARNING_RATES, fit, fused, mlp, mlps

CALLBACKS = [SuccessiveHalving, ASHA, Hyperband]


@pytest.mark.parametrize("callback", CALLBACKS)
def test_mode_must_be_min_or_max(callback):
    with pytest.raises(ValueError, match=rf"{callback.__name__}: mode must be 'min' or 'max', got 'best'\. Use mode="):
        callback("val_loss", mode="best")


@pytest.mark.parametrize("callback", CALLBACKS)
def test_reduction_factor_must_be_above_one(callback):
    with pytest.raises(ValueError, match=r"reduction_factor must be an integer >= 2, got 1\. Each rung keeps about"):
        callback("val_loss", reduction_factor=1)
    with pytest.raises(TypeError, match=r"reduction_factor must be an integer >= 2, got float 2\.5"):
        callback("val_loss", reduction_factor=2.5)


def test_grace_period_must_be_positive_and_within_max_t():
    with pytest.raises(ValueError, match=r"ASHA: grace_period must be >= 1, got 0\. It is the budget every trial"):
        ASHA("val_loss", grace_period=0)
    with pytest.raises(
        ValueError, match=r"ASHA: grace_period=10 is greater than max_t=9, so no trial would ever be judged\. Lower"
    ):
        ASHA("val_loss", grace_period=10, max_t=9)
    with pytest.raises(TypeError, match=r"ASHA: max_t must be an integer number of epochs or steps, got str '9'"):
        ASHA("val_loss", max_t="9")


def test_monitor_time_attr_namespace_and_trial_id_are_checked():
    with pytest.raises(ValueError, match=r"ASHA: monitor must be the name of a logged metric, e.g. 'val_loss', got ''"):
        ASHA("")
    with pytest.raises(ValueError, match=r"ASHA: time_attr must be 'epochs' or 'steps', got 'batches': the unit"):
        ASHA("val_loss", time_attr="batches")
    with pytest.raises(ValueError, match=r"ASHA: namespace must be a non-empty string naming the sweep, got ''"):
        ASHA("val_loss", namespace="")
    with pytest.raises(TypeError, match=r"ASHA: trial_id must be an int, a str or None, got float"):
        ASHA("val_loss", trial_id=1.5)


def test_storage_that_cannot_be_opened_fails_at_construction(tmp_path):
    with pytest.raises(
        StoreOpenError, match=r"ASHA: cannot use this storage: SqliteRungStore: cannot create .*does not"
    ):
        ASHA("val_loss", storage=str(tmp_path / "missing" / "asha.db"))
    with pytest.raises(StoreOpenError, match=r"Hyperband: cannot use this storage: open_store: malformed SQLite URL"):
        Hyperband("val_loss", storage="sqlite://asha.db")
    with pytest.raises(TypeError, match=r"ASHA: storage: open_store: expected None, a path, a database URL"):
        ASHA("val_loss", storage=3)


def test_max_t_beyond_max_epochs_fails_before_training():
    with pytest.raises(
        ValueError,
        match=r"SuccessiveHalving: max_t=27 epochs is beyond the Trainer's max_epochs=2, so no trial could reach "
        r"max_t\. Lower max_t to at most 2, or raise the Trainer's max_epochs\.",
    ):
        fit(fused([0.1, 0.2]), [SuccessiveHalving("val_loss", max_t=27)], max_epochs=2)


def test_max_t_beyond_the_steps_the_trainer_will_take_fails_before_training():
    module = fused([0.1, 0.2])
    with pytest.raises(
        ValueError, match=r"ASHA: max_t=100 steps is beyond the 6 optimizer steps this Trainer will take"
    ):
        fit(module, [ASHA("val_loss", time_attr="steps", max_t=100)], max_epochs=2)
    assert module.results[0]["steps"] == 0  # raised in on_train_start: nothing trained


def test_max_t_defaults_to_the_trainers_limit_and_needs_one():
    callback = ASHA("val_loss")
    fit(fused([0.1, 0.2]), [callback], max_epochs=2)
    assert callback.config.max_t == 2
    with pytest.raises(ValueError, match=r"ASHA: max_t is not set and the Trainer has no max_epochs limit.*max_t=27"):
        fit(fused([0.1, 0.2]), [ASHA("val_loss")], max_epochs=-1, max_steps=4)


def test_a_monitor_never_logged_is_reported_with_what_is_logged(tmp_path):
    with pytest.raises(
        RuntimeError,
        match=r"ASHA\(monitor='val_los'\): the monitor is not logged by any trial of the fused module at the end of "
        r"the first validation; logged: 'val_acc', 'val_loss'\. Pass the name the trial modules give self\.log",
    ):
        fit(fused([0.1, 0.2]), [ASHA("val_los", max_t=2)], max_epochs=2)
    with pytest.raises(
        RuntimeError,
        match=r"ASHA\(monitor='accuracy'\): the monitor is not logged in trainer.callback_metrics at the end of the "
        r"first validation; logged: 'train_loss', 'val_acc', 'val_loss'\.",
    ):
        fit(mlp(0.1), [ASHA("accuracy", max_t=2, storage=str(tmp_path / "rungs.db"))], max_epochs=2)


def test_refill_needs_a_fused_module(tmp_path):
    callback = ASHA("val_loss", max_t=2, refill=[mlp(0.1)], storage=str(tmp_path / "rungs.db"))
    with pytest.raises(ValueError, match=r"ASHA: refill= needs a FusedLightningModule .*got a DigitsMLP\. With one"):
        fit(mlp(0.2), [callback], max_epochs=2)


def test_without_validation_decisions_use_training_values():
    """No validation loop: a fused group is judged on what it logs in training, once the epoch's values exist."""
    lrs = LEARNING_RATES[:6]
    module = fused(lrs)
    callback = SuccessiveHalving("train_loss", grace_period=1, reduction_factor=2, max_t=2)
    fit(module, [callback], max_epochs=2, limit_val_batches=0)
    first_epoch = {tid: module.results[tid]["history"][0] for tid in range(6)}
    assert [module.results[t]["epochs"] for t in range(6)].count(1) == 3  # 3 of 6 cut after one epoch
    stopped = {tid for tid, r in module.results.items() if r["epochs"] == 1}
    assert all(module.results[t]["reason"].startswith("SuccessiveHalving rung 0") for t in stopped)
    assert first_epoch  # the history exists for every trial


def test_plain_module_without_validation_is_judged_at_the_end_of_each_epoch(tmp_path):
    storage = str(tmp_path / "rungs.db")
    first, second = (ASHA("train_loss", max_t=3, storage=storage, trial_id=name) for name in ("good", "bad"))
    fit(mlp(0.3), [first], max_epochs=3, limit_val_batches=0)
    trainer = fit(mlp(0.0001), [second], max_epochs=3, limit_val_batches=0)
    assert (first.status, second.status) == ("completed", "stopped")
    assert trainer.current_epoch == 1  # stopped at the first rung; fit ended normally
    assert second.result["budget"] == 1
    assert second.result["rung"] == 0


def test_state_dict_round_trip_and_settings_mismatch():
    callback = ASHA("val_loss", max_t=2)
    module = fused([0.1, 0.01, 0.001])
    fit(module, [callback], max_epochs=2)
    state = callback.state_dict()
    restored = ASHA("val_loss", max_t=2)
    fit(fused([0.1, 0.01, 0.001]), [restored], max_epochs=2)  # sets up a rule, then load as Lightning would
    restored.load_state_dict(state)
    assert restored.endings == callback.endings
    assert restored.rule.records() == callback.rule.records()
    other = ASHA("val_loss", max_t=2, reduction_factor=2)
    fit(fused([0.1, 0.01, 0.001]), [other], max_epochs=2)
    with pytest.raises(ValueError, match=r"ASHA.load_state_dict: the checkpoint was made with .*'reduction_factor': 3"):
        other.load_state_dict(state)


def test_decisions_are_made_on_rank_zero_and_broadcast(monkeypatch):
    """A rank other than zero never asks the rule; it applies what rank zero broadcast and ends the same."""
    lrs = LEARNING_RATES[:6]
    sent: list[object] = []
    rank_zero = ASHA("val_loss", max_t=3, refill=mlps([0.05, 0.07]))
    module_zero = fused(lrs)
    original = SingleDeviceStrategy.broadcast

    def recording_broadcast(self, obj, src=0):
        sent.append(obj)
        return original(self, obj, src)

    monkeypatch.setattr(SingleDeviceStrategy, "broadcast", recording_broadcast)
    fit(module_zero, [rank_zero], max_epochs=3)

    received = iter(sent)
    monkeypatch.setattr(SingleDeviceStrategy, "broadcast", lambda self, obj, src=0: next(received))
    monkeypatch.setattr(SingleDeviceStrategy, "is_global_zero", property(lambda self: False))
    rank_one = ASHA("val_loss", max_t=3, refill=mlps([0.05, 0.07]))
    module_one = fused(lrs)
    fit(module_one, [rank_one], max_epochs=3)

    assert rank_one.rule.records() == []  # never decided anything itself
    assert next(received, None) is None  # consumed every broadcast, in the same order
    assert {t: (r["status"], r["epochs"]) for t, r in module_one.results.items()} == {
        t: (r["status"], r["epochs"]) for t, r in module_zero.results.items()
    }
    assert any(r["status"] == "stopped" for r in module_zero.results.values())


def test_deadline_takes_every_shared_check():
    with pytest.raises(ValueError, match=r"Deadline: reduction_factor must be an integer >= 2, got 0"):
        Deadline("val_loss", deadline=60, reduction_factor=0)
