import torch

from lightning_hydro.sweeper.job.metric_history import MetricHistory, scalar_metrics


def test_records_per_trial_and_epoch_and_survives_a_checkpoint():
    history = MetricHistory(default_trial=0)
    history.record(epoch=0, metrics={"val_acc": torch.tensor(0.5), "val_acc/trial_3": 0.25, "vec": torch.ones(2)})
    history.record(epoch=0, metrics={"train_loss": 1.0})
    history.record(epoch=1, metrics={"val_acc": 0.75, "val_loss/trial_3": float("nan")})
    assert history.of(0) == [{"epoch": 0, "val_acc": 0.5, "train_loss": 1.0}, {"epoch": 1, "val_acc": 0.75}]
    assert history.last(0) == {"val_acc": 0.75, "train_loss": 1.0}
    assert history.of(3)[0] == {"epoch": 0, "val_acc": 0.25}
    assert history.of(9) == []

    restored = MetricHistory()
    restored.load_state_dict(history.state_dict())
    assert restored.of(0) == history.of(0)
    # A fused module's metrics only: no default trial, unsuffixed names are dropped.
    restored.record(epoch=2, metrics={"val_acc": 1.0})
    assert len(restored.of(0)) == 2


def test_scalar_metrics():
    assert scalar_metrics({"a": torch.tensor(2.0), "b": 3, "c": True, "d": "x", "e": torch.zeros(3)}) == {
        "a": 2.0,
        "b": 3.0,
    }
