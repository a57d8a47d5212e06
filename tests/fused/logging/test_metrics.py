import math

import pytest
import torch
import torchmetrics

from lightning_hydro.backends import StackedLog
from lightning_hydro.fused.logging.metrics import MetricOptions, TrialMetrics, resolve_options


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


def test_metric_objects_logged_on_step_only_are_reset_at_epoch_end_without_an_epoch_value():
    metrics = TrialMetrics()
    accuracy = [torchmetrics.MeanMetric(), torchmetrics.MeanMetric()]
    for metric, value in zip(accuracy, (0.5, 1.0)):
        metric(torch.tensor(value))  # forward: the batch value a step logs
    # training_step's default is on_step=True, on_epoch=False; Lightning still resets the object at the epoch's end
    metrics.record_step("train", "training_step", [StackedLog("acc", list(accuracy))], [0, 1], batch=None)
    assert metrics.step_values() == {0: {"acc": 0.5}, 1: {"acc": 1.0}}
    assert metrics.epoch_options("train") == {}
    assert metrics.finish_epoch("train") == {}
    assert [metric.update_count for metric in accuracy] == [0, 0]


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


def two_ranks(other_rank: dict[str, torch.Tensor]):
    """A reducer as two DDP ranks would see it: this rank's tensor combined with the other rank's."""
    ops = {"sum": torch.add, "mean": lambda a, b: (a + b) / 2, "max": torch.maximum, "min": torch.minimum}

    def reduce(values, op):
        key = "pairs" if values.dim() == 2 else "values"
        return ops[op](values, other_rank[key].to(values.dtype))

    return reduce


def test_sync_dist_epoch_mean_covers_both_ranks_data_weighted_by_batch_size():
    metrics = TrialMetrics()
    opts = resolve_options("validation_step", {"sync_dist": True})
    assert opts.sync_dist
    metrics.record("validate", "val_loss", torch.tensor([1.0, 4.0]), opts, trial_ids=[0, 1], batch_size=30)
    # the other rank saw 10 examples of each trial, with means 3.0 and 8.0
    metrics.reduce = two_ranks({"pairs": torch.tensor([[3.0 * 10, 10.0], [8.0 * 10, 10.0]])})
    assert metrics.finish_epoch("validate") == {
        0: {"val_loss": pytest.approx((1.0 * 30 + 3.0 * 10) / 40)},
        1: {"val_loss": pytest.approx((4.0 * 30 + 8.0 * 10) / 40)},
    }
    assert not metrics.unsynced


def test_without_sync_dist_each_rank_keeps_its_own_value_and_the_name_is_noted():
    metrics = TrialMetrics()
    metrics.reduce = two_ranks({})  # never called
    metrics.record("validate", "val_acc", torch.tensor([0.5]), resolve_options("validation_step", {}), trial_ids=[0])
    assert metrics.finish_epoch("validate") == {0: {"val_acc": 0.5}}
    assert metrics.unsynced == {"val_acc"}


def test_sync_dist_step_values_are_reduced_when_logged_and_max_reduces_by_max():
    metrics = TrialMetrics()
    opts = resolve_options("training_step", {"sync_dist": True, "on_epoch": True, "reduce_fx": "max"})
    metrics.reduce = two_ranks({"values": torch.tensor([5.0, 0.0])})  # the other rank's values (step and epoch)
    metrics.record("train", "grad", torch.tensor([1.0, 2.0]), opts, trial_ids=[0, 1], batch_size=4)
    assert metrics.step_values() == {0: {"grad_step": 5.0}, 1: {"grad_step": 2.0}}
    metrics.record("train", "grad", torch.tensor([0.5, 3.0]), opts, trial_ids=[0, 1], batch_size=4)
    assert metrics.finish_epoch("train") == {0: {"grad": 5.0}, 1: {"grad": 3.0}}


def test_sync_dist_values_from_epoch_hooks_are_reduced_too():
    metrics = TrialMetrics()
    metrics.reduce = two_ranks({"values": torch.tensor([0.25, 1.0])})
    opts = resolve_options("on_validation_epoch_end", {"sync_dist": True})
    metrics.record_epoch_value("validate", "acc_best", {3: 0.75}, opts)
    metrics.record_epoch_value("validate", "acc_best", {5: 0.5}, opts)
    metrics.record_epoch_value("validate", "own", {3: 9.0})
    assert metrics.finish_epoch("validate") == {3: {"acc_best": 0.5, "own": 9.0}, 5: {"acc_best": 0.75}}
