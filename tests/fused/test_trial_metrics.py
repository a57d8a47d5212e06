import math

import pytest
import torch
import torchmetrics

from lightning_hydro.fused.trial_metrics import MetricOptions, TrialMetrics, resolve_options


def test_defaults_follow_the_hook_like_lightning():
    assert resolve_options("training_step", {}) == MetricOptions(on_step=True, on_epoch=False)
    assert resolve_options("validation_step", {}) == MetricOptions(on_step=False, on_epoch=True)
    assert resolve_options("training_step", {"on_epoch": True, "reduce_fx": torch.max}).reduce_fx == "max"
    with pytest.raises(ValueError, match=r"self.log\(reduce_fx='median'\) is not supported for fused trials"):
        resolve_options("training_step", {"reduce_fx": "median"})


@pytest.mark.parametrize(("reduce_fx", "expected"), [("mean", 1.75), ("sum", 4.0), ("max", 2.0), ("min", 1.0)])
def test_epoch_reductions(reduce_fx, expected):
    metrics = TrialMetrics()
    opts = MetricOptions(on_step=False, on_epoch=True, reduce_fx=reduce_fx)
    for value, size in ((1.0, 1), (2.0, 3), (1.0, 0)):
        metrics.record("train", "m", torch.tensor([value]), opts, trial_ids=[0], batch_size=size)
    if reduce_fx == "mean":
        expected = (1.0 * 1 + 2.0 * 3) / 4
    assert metrics.finish_epoch("train") == {0: {"m": pytest.approx(expected)}}


def test_reslot_keeps_each_trials_own_batches():
    metrics = TrialMetrics()
    opts = MetricOptions(on_step=True, on_epoch=True)
    metrics.record("train", "loss", torch.tensor([1.0, 2.0, 3.0]), opts, trial_ids=[0, 1, 2])
    metrics.reslot()  # trial 1 stopped, trial 3 joined
    metrics.record("train", "loss", torch.tensor([3.0, 5.0, 7.0]), opts, trial_ids=[0, 2, 3])
    assert metrics.finish_epoch("train") == {0: {"loss": 2.0}, 1: {"loss": 2.0}, 2: {"loss": 4.0}, 3: {"loss": 7.0}}
    assert metrics.step_values() == {0: {"loss_step": 3.0}, 2: {"loss_step": 5.0}, 3: {"loss_step": 7.0}}


def test_step_values_survive_a_reslot_until_the_next_step():
    metrics = TrialMetrics()
    opts = MetricOptions(on_step=True, on_epoch=False)
    metrics.record("train", "loss", torch.tensor([1.0, 2.0]), opts, trial_ids=[0, 1])
    metrics.reslot()  # two trials stopped one after the other: both keep their last values
    assert metrics.step_values() == {0: {"loss": 1.0}, 1: {"loss": 2.0}}


def test_metric_objects_are_computed_and_reset_at_epoch_end():
    metrics = TrialMetrics()
    accuracy = {0: torchmetrics.MeanMetric(), 1: torchmetrics.MeanMetric()}
    accuracy[0].update(torch.tensor([1.0, 0.0]))
    accuracy[1].update(torch.tensor([1.0, 1.0]))
    metrics.record_objects("validate", "acc", accuracy, MetricOptions())
    assert metrics.finish_epoch("validate") == {0: {"acc": 0.5}, 1: {"acc": 1.0}}
    assert accuracy[0].update_count == 0


def test_epoch_values_from_hooks_and_empty_means():
    metrics = TrialMetrics()
    metrics.record_epoch_value("validate", "custom", {4: 0.25})
    opts = MetricOptions()
    metrics.record("validate", "m", torch.tensor([1.0]), opts, trial_ids=[4], batch_size=0)
    out = metrics.finish_epoch("validate")
    assert out[4]["custom"] == 0.25
    assert math.isnan(out[4]["m"])


def test_the_epoch_so_far_is_read_without_ending_the_epoch():
    metrics = TrialMetrics()
    options = MetricOptions(on_step=False, on_epoch=True)
    metrics.record("train", "loss", torch.tensor([1.0, 3.0]), options, trial_ids=[0, 1], batch_size=2)
    assert metrics.epoch_so_far("train") == {0: {"loss": 1.0}, 1: {"loss": 3.0}}
    metrics.record("train", "loss", torch.tensor([3.0, 5.0]), options, trial_ids=[0, 1], batch_size=2)
    assert metrics.epoch_so_far("train") == {0: {"loss": 2.0}, 1: {"loss": 4.0}}
    assert metrics.finish_epoch("train") == {0: {"loss": 2.0}, 1: {"loss": 4.0}}
    assert metrics.epoch_so_far("train") == {}
