"""The batched metric updates give each trial's metric what its own update gives, also when the trials construct
their metrics differently (lightning_hydro/backends/batched_metrics.py).

The trials' weights and inputs are small integers, so every logit is exact in float32 whatever the backend: the
fused and unfused metrics see bit-identical inputs, and their states must be bit-identical too.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import lightning as L
import pytest
import torch
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends import make_backend
from lightning_hydro.backends.batched_metrics import update_all
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from lightning_hydro.stacking.stacked_state import StackedState
from tests.helpers import SeriesLogger, make_trainer

CLASSES = 4
# per trial: top_k, average, num_classes, ignore_index, nan_strategy
CONFIGURATIONS: list[dict[str, Any]] = [
    dict(top_k=1, average="micro", num_classes=CLASSES, ignore_index=None, nan_strategy="disable"),
    dict(top_k=2, average="macro", num_classes=CLASSES + 1, ignore_index=0, nan_strategy="ignore"),
    dict(top_k=3, average="weighted", num_classes=CLASSES + 2, ignore_index=None, nan_strategy="ignore"),
    dict(top_k=1, average="micro", num_classes=CLASSES, ignore_index=None, nan_strategy="disable"),  # as trial 0
]
NAMES = ("topk", "f1", "wide", "ignoring", "mean")


class ConfiguredPerTrial(L.LightningModule):
    """Metrics whose construction is a hyperparameter of the trial."""

    def __init__(self, seed: int, configuration: dict[str, Any]) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.layer = nn.Linear(6, CLASSES)
        with torch.no_grad():
            self.layer.weight.copy_(torch.randint(-3, 4, (CLASSES, 6), generator=g).float())
            self.layer.bias.copy_(torch.randint(-3, 4, (CLASSES,), generator=g).float())
        c = configuration
        self.topk = MulticlassAccuracy(num_classes=CLASSES, top_k=c["top_k"])
        self.f1 = MulticlassF1Score(num_classes=CLASSES, average=c["average"])
        self.wide = MulticlassAccuracy(num_classes=c["num_classes"])
        self.ignoring = MulticlassAccuracy(num_classes=CLASSES, ignore_index=c["ignore_index"])
        self.mean = MeanMetric(nan_strategy=c["nan_strategy"])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self.layer(x)
        preds = logits.argmax(dim=1)
        self.topk.update(logits, y)
        self.f1.update(preds, y)
        self.wide.update(preds, y)
        self.ignoring.update(preds, y)
        # a NaN in the second batch: "ignore" drops it, "disable" keeps it
        self.mean.update(logits.mean() * (float("nan") if batch_idx == 1 else 1.0))


def batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [
        (torch.randint(-2, 3, (9, 6), generator=g).float(), torch.randint(0, CLASSES, (9,), generator=g))
        for _ in range(count)
    ]


def states(module: ConfiguredPerTrial) -> dict[str, torch.Tensor]:
    out = {}
    for name in NAMES:
        metric = getattr(module, name)
        out.update({f"{name}.{state}": torch.as_tensor(value) for state, value in metric.metric_state.items()})
        out[f"{name}.value"] = metric.compute()
        out[f"{name}.updates"] = torch.tensor(metric.update_count)
    return out


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_each_trials_metric_gets_its_own_configurations_update(backend: str) -> None:
    trials = [ConfiguredPerTrial(seed, c) for seed, c in enumerate(CONFIGURATIONS)]
    alone = copy.deepcopy(trials)
    runner = make_backend(backend, StackedState(nn.Module(), trials, list(range(len(trials)))))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # compute() of the never-updated ignoring metric of no sample
        for index, batch in enumerate(batches(3)):
            runner.run("validation_step", batch, index)
            for module in alone:
                module.validation_step(batch, index)
        for row, (fused_module, module) in enumerate(zip(trials, alone)):
            fused_states, own_states = states(fused_module), states(module)
            for name, own in own_states.items():
                torch.testing.assert_close(fused_states[name], own, rtol=0, atol=0, equal_nan=True, msg=f"{row} {name}")


def test_update_all_batches_the_trials_that_share_a_configuration_and_leaves_the_others() -> None:
    metrics = [MulticlassAccuracy(num_classes=3, average=a) for a in ("micro", "macro", "micro", "none")]
    alone = copy.deepcopy(metrics)
    preds, target = torch.tensor([[0, 1, 2], [0, 0, 0], [1, 1, 1], [2, 1, 0]]), torch.tensor([[0, 1, 1]] * 4)
    assert update_all(metrics, (preds, target), {}) == {0, 1, 2, 3}
    for row, metric in enumerate(alone):
        metric.update(preds[row], target[row])
        assert torch.equal(metrics[row].compute(), metric.compute()), row
    metrics = [MulticlassAccuracy(num_classes=3, top_k=k) for k in (1, 2, 1)]
    logits = torch.randn(3, 5, 3)
    assert update_all(metrics, (logits, torch.zeros(3, 5, dtype=torch.long)), {}) == {0, 2}  # top_k=2: no rule
    assert [m.update_count for m in metrics] == [1, 0, 1]


class TopK(DigitsMLP):
    """A digits MLP whose validation accuracy counts a hit in the top ``k`` classes, ``k`` a hyperparameter."""

    def __init__(self, lr: float, k: int) -> None:
        super().__init__(hidden_dim=16, lr=lr)
        self.val_topk = MulticlassAccuracy(num_classes=10, top_k=k)
        self.val_f1 = MulticlassF1Score(num_classes=10, average="micro" if k == 1 else "macro")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.val_topk.update(logits, y)
        self.val_f1.update(logits.argmax(dim=1), y)
        self.log("val/topk", self.val_topk)
        self.log("val/f1", self.val_f1)


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_trials_of_several_top_k_log_the_values_they_log_alone(backend: str) -> None:
    limits: dict[str, Any] = dict(max_epochs=2, limit_train_batches=3, limit_val_batches=2)
    modules = []
    for seed, (lr, k) in enumerate([(0.05, 1), (0.1, 2), (0.2, 3)]):
        torch.manual_seed(seed)
        modules.append(TopK(lr, k))
    alone = []
    for module in modules:
        logger = SeriesLogger()
        torch.manual_seed(1234)
        make_trainer(logger=logger, **limits).fit(copy.deepcopy(module), datamodule=DigitsDataModule())
        alone.append(logger.series)
    logger = SeriesLogger()
    fused = FusedLightningModule(copy.deepcopy(modules), backend=backend, summary=False)
    torch.manual_seed(1234)
    make_trainer(logger=logger, **limits).fit(fused, datamodule=DigitsDataModule())
    for tid, series in enumerate(alone):
        for name in ("val/topk", "val/f1"):
            fused_values = [value for _, value in logger.series[f"{name}/trial_{tid}"]]
            assert fused_values == pytest.approx([value for _, value in series[name]], rel=1e-5), (tid, name)
