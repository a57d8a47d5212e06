"""torchmetrics under the fused backends: each trial's metrics equal its unfused metrics exactly.

The module mixes updates that run batched (Accuracy and F1 with top_k=1, MeanMetric of a scalar:
lightning_hydro/backends/batched_metrics.py) with updates replayed per trial (ignore_index, MeanMetric of a
vector, MaxMetric, values that are logged, a MetricCollection).

The trials' weights and inputs are small integers, so every logit is computed exactly in float32 whatever the
backend's reduction order: fused and unfused metrics then see bit-identical inputs, and any difference in
their values comes from the metric machinery alone.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import lightning as L
import pytest
import torch
from torch import nn
from torchmetrics import Accuracy, F1Score, MaxMetric, MeanMetric, MetricCollection, Precision, Recall
from torchmetrics.wrappers import ClasswiseWrapper, MinMaxMetric

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends import FusionError, make_backend
from lightning_hydro.backends.deferred_metrics import DeferredValue, preserved_metric_states
from lightning_hydro.backends.trial_logging import capture_logs
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from lightning_hydro.stacking.stacked_state import StackedState
from tests.helpers import make_trainer

CLASSES = 4


class MetricsEverywhere(L.LightningModule):
    """A classifier that updates every common kind of metric, as published modules do."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.layer = nn.Linear(6, CLASSES)
        with torch.no_grad():
            self.layer.weight.copy_(torch.randint(-3, 4, (CLASSES, 6), generator=g).float())
            self.layer.bias.copy_(torch.randint(-3, 4, (CLASSES,), generator=g).float())
        self.acc = Accuracy(task="multiclass", num_classes=CLASSES)
        self.f1 = F1Score(task="multiclass", num_classes=CLASSES, average="macro")
        self.mean_logit = MeanMetric()
        self.max_logit = MaxMetric()
        self.batch_acc = Accuracy(task="multiclass", num_classes=CLASSES)
        self.acc_ignoring = Accuracy(task="multiclass", num_classes=CLASSES, ignore_index=0)
        self.mean_row = MeanMetric()
        self.collection = MetricCollection(
            [Precision(task="multiclass", num_classes=CLASSES), Recall(task="multiclass", num_classes=CLASSES)],
            prefix="val/",
        )

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self.layer(x)
        preds = logits.argmax(dim=1)
        self.acc(preds, y)
        self.f1.update(logits, y)
        self.mean_logit(logits.mean())
        self.max_logit.update(logits.max())
        self.acc_ignoring(preds, y)
        self.mean_row(logits.mean(dim=1))
        self.log("acc", self.acc)
        self.log("f1", self.f1)
        self.log("batch_acc", self.batch_acc(preds, y))  # the value forward returns, logged
        self.log_dict(self.collection(preds, y))  # a MetricCollection's forward values


def batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [
        (torch.randint(-2, 3, (9, 6), generator=g).float(), torch.randint(0, CLASSES, (9,), generator=g))
        for _ in range(count)
    ]


def metric_values(module: MetricsEverywhere) -> dict[str, Any]:
    names = ("acc", "f1", "mean_logit", "max_logit", "batch_acc", "acc_ignoring", "mean_row")
    values = {name: getattr(module, name).compute() for name in names}
    values.update(module.collection.compute())
    values["updates"] = module.acc.update_count
    return values


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_each_trials_metrics_equal_its_unfused_metrics_exactly(backend: str) -> None:
    trials = [MetricsEverywhere(seed) for seed in range(3)]
    alone = copy.deepcopy(trials)
    group = StackedState(nn.Module(), trials, [0, 1, 2])
    runner = make_backend(backend, group)
    logged: list[dict[str, torch.Tensor]] = []
    for index, batch in enumerate(batches(4)):
        out = runner.run("validation_step", batch, index)
        logged.append({log.name: log.values for log in out.logs if isinstance(log.values, torch.Tensor)})
        objects = {log.name: log.values for log in out.logs if isinstance(log.values, list)}
        assert [o is t.acc for o, t in zip(objects["acc"], trials)] == [True] * 3  # each trial's own metric
    alone_logged = []
    for module in alone:
        per_batch = []
        for index, batch in enumerate(batches(4)):
            with capture_logs(module) as calls:
                module.validation_step(batch, index)
            per_batch.append({call.name: call.value for call in calls})
        alone_logged.append(per_batch)
    for row, (fused_module, module) in enumerate(zip(trials, alone)):
        fused_values, own_values = metric_values(fused_module), metric_values(module)
        assert fused_values.keys() == own_values.keys()
        for name, own in own_values.items():
            assert torch.equal(torch.as_tensor(fused_values[name]), torch.as_tensor(own)), (row, name)
        for step, own_step in enumerate(alone_logged[row]):  # values forward returned, per batch: bitwise
            for name in ("batch_acc", "val/MulticlassPrecision", "val/MulticlassRecall"):
                assert logged[step][name][row].item() == float(own_step[name]), (row, step, name)
    assert runner.deferred_metrics == [
        "acc",
        "f1",
        "mean_logit",
        "max_logit",
        "acc_ignoring",
        "mean_row",
        "batch_acc",
        "collection",
    ]


class UsesTheValue(MetricsEverywhere):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        acc = self.acc(self.layer(x).argmax(dim=1), y)
        self.log("acc_pct", acc * 100)


class ComputesInTheStep(MetricsEverywhere):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.acc.update(self.layer(x).argmax(dim=1), y)
        self.log("acc", self.acc.compute())


@pytest.mark.parametrize(
    ("module_class", "message"),
    [
        (UsesTheValue, r"uses the value that MulticlassAccuracy.forward returns \(acc\(...\)\).*backend='loop'"),
        (ComputesInTheStep, r"calls MulticlassAccuracy.compute\(\) of torchmetrics metric 'acc'.*backend='loop'"),
    ],
)
def test_what_cannot_be_deferred_is_refused_with_the_metric_and_the_fix(module_class: type, message: str) -> None:
    group = StackedState(nn.Module(), [module_class(seed) for seed in range(2)], [0, 1])
    with pytest.raises(FusionError, match=message):
        make_backend("vmap", group).run("validation_step", batches(1)[0], 0)
    assert "forward" not in vars(group.modules[0].acc)  # the recorders are gone after the error


def test_a_deferred_value_refuses_torch_functions() -> None:
    value = DeferredValue("acc", "MulticlassAccuracy", 0)
    with pytest.raises(FusionError, match=r"uses the value that MulticlassAccuracy.forward returns"):
        torch.add(torch.ones(1), value)  # type: ignore[arg-type]
    assert not hasattr(value, "__array__")  # protocol probes get the usual AttributeError
    with pytest.raises(FusionError, match=r"\(acc\(...\)\)"):
        _ = value == 0.5  # a comparison would silently be False


class LogsAClasswiseDict(MetricsEverywhere):
    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.per_class = ClasswiseWrapper(Accuracy(task="multiclass", num_classes=CLASSES, average=None))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log_dict(self.per_class(self.layer(x).argmax(dim=1), y))  # forward returns {"multiclassaccuracy_0": ...}


class ReadsAMinMaxDict(MetricsEverywhere):
    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.bounded = MinMaxMetric(Accuracy(task="multiclass", num_classes=CLASSES))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("acc_max", self.bounded(self.layer(x).argmax(dim=1), y)["max"])


@pytest.mark.parametrize(
    ("module_class", "path", "metric_class"),
    [(LogsAClasswiseDict, "per_class", "ClasswiseWrapper"), (ReadsAMinMaxDict, "bounded", "MinMaxMetric")],
)
def test_a_dict_that_a_metric_returns_is_refused_with_the_epoch_end_fix(
    module_class: type, path: str, metric_class: str
) -> None:
    group = StackedState(nn.Module(), [module_class(seed) for seed in range(2)], [0, 1])
    message = (
        rf"reads the dict that {metric_class}.forward returns \({path}\(...\)\).*Update the metric in the step "
        rf"\(self.{path}.update\(...\)\) and log its dict in the epoch-end hook "
        rf"\(self.log_dict\(self.{path}.compute\(\)\), then self.{path}.reset\(\)\), or use backend='loop'"
    )
    with pytest.raises(FusionError, match=message):
        make_backend("vmap", group).run("validation_step", batches(1)[0], 0)


class ClasswiseAtEpochEnd(DigitsMLP):
    """The fix the refusal gives: update in the step, log the computed dict in the epoch-end hook."""

    def __init__(self, lr: float) -> None:
        super().__init__(hidden_dim=16, lr=lr)
        self.val_per_class = ClasswiseWrapper(Accuracy(task="multiclass", num_classes=10, average=None), prefix="acc_")
        self.logged: list[dict[str, float]] = []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.val_per_class.update(self(x).argmax(dim=1), y)

    def on_validation_epoch_end(self) -> None:
        values = self.val_per_class.compute()
        self.log_dict(values)
        self.logged.append({name: float(value) for name, value in values.items()})
        self.val_per_class.reset()


def test_the_epoch_end_fix_logs_each_trials_classwise_values_as_alone() -> None:
    limits: dict[str, Any] = dict(max_epochs=2, limit_train_batches=3, limit_val_batches=2)
    modules = []
    for seed, lr in enumerate((0.05, 0.2)):
        torch.manual_seed(seed)
        modules.append(ClasswiseAtEpochEnd(lr))
    alone = []
    for module in modules:
        copied = copy.deepcopy(module)
        torch.manual_seed(1234)
        make_trainer(**limits).fit(copied, datamodule=DigitsDataModule())
        alone.append(copied)
    fused = FusedLightningModule(copy.deepcopy(modules), backend="vmap", summary=False)
    torch.manual_seed(1234)
    make_trainer(**limits).fit(fused, datamodule=DigitsDataModule())
    for tid, module in enumerate(alone):
        trial = fused.trial_module(tid)
        assert len(trial.logged) == len(module.logged) == 2
        for fused_epoch, alone_epoch in zip(trial.logged, module.logged):
            assert sorted(fused_epoch) == sorted(alone_epoch)
            assert fused_epoch == pytest.approx(alone_epoch, rel=1e-5)
        assert fused.results[tid]["metrics"]["acc_3"] == pytest.approx(module.logged[-1]["acc_3"], rel=1e-5)


@pytest.mark.filterwarnings("ignore:The ``compute`` method:UserWarning", "ignore:You are trying to `self.log()`")
def test_preserved_metric_states_undo_updates() -> None:
    module = MetricsEverywhere(0)
    x, y = batches(1)[0]
    module.acc(module.layer(x).argmax(dim=1), y)
    module.collection(module.layer(x).argmax(dim=1), y)
    before = metric_values(module)
    with preserved_metric_states([module]):
        module.validation_step((x, y), 0)
        module.validation_step((x, y), 1)
    after = metric_values(module)
    assert before["updates"] == after["updates"] == 1
    for name, value in before.items():  # bitwise (metrics that were never updated compute NaN before and after)
        torch.testing.assert_close(torch.as_tensor(after[name]), torch.as_tensor(value), rtol=0, atol=0, equal_nan=True)


class OutOfRange(MetricsEverywhere):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.acc(self.layer(x).argmax(dim=1), y + 2)  # some labels out of range: torchmetrics counts them wrong


class ShapeMismatch(MetricsEverywhere):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.acc(self.layer(x).argmax(dim=1), y[:-1])  # torchmetrics rejects preds and targets of two lengths


def test_inputs_outside_the_batched_rules_behave_as_unfused() -> None:
    """Inputs the batched rules do not take are left to each trial's own metric: the same state, the same error."""
    trials = [OutOfRange(seed) for seed in range(2)]
    alone = copy.deepcopy(trials)
    make_backend("vmap", StackedState(nn.Module(), trials, [0, 1])).run("validation_step", batches(1)[0], 0)
    for fused_module, module in zip(trials, alone):
        module.validation_step(batches(1)[0], 0)
        assert torch.equal(fused_module.acc.compute(), module.acc.compute())
    group = StackedState(nn.Module(), [ShapeMismatch(seed) for seed in range(2)], [0, 1])
    with pytest.raises(ValueError, match="The `preds` and `target` should have the same shape"):
        make_backend("vmap", group).run("validation_step", batches(1)[0], 0)
    with pytest.raises(ValueError, match="The `preds` and `target` should have the same shape"):
        ShapeMismatch(0).validation_step(batches(1)[0], 0)


class NanLoss(MetricsEverywhere):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, _ = batch
        logits = self.layer(x)
        self.mean_logit(logits.mean() * float("nan"))  # removed with a warning, by each trial's own metric
        self.mean_logit(logits.mean())


def test_nan_values_are_removed_with_torchmetrics_warning_per_trial() -> None:
    trials = [NanLoss(seed) for seed in range(3)]
    alone = copy.deepcopy(trials)
    group = StackedState(nn.Module(), trials, [0, 1, 2])
    with pytest.warns(UserWarning, match="Encountered `nan` values"):
        make_backend("vmap", group).run("validation_step", batches(1)[0], 0)
    for fused_module, module in zip(trials, alone):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module.validation_step(batches(1)[0], 0)
            assert torch.equal(fused_module.mean_logit.mean_value, module.mean_logit.mean_value)
            assert torch.equal(fused_module.mean_logit.weight, module.mean_logit.weight)
            assert fused_module.mean_logit.weight.item() == 1.0
