"""One vectorised update for all trials, for the commonest torchmetrics updates (the rest replay per trial).

Replaying a recorded ``update`` on each trial's metric costs B calls of torchmetrics' Python (argument
validation, formatting, state bookkeeping). For the two families that published modules use most, the
per-trial increments are computed for all trials at once from the ``[B, ...]`` recorded arguments, with the
same integer or float operations as torchmetrics, and added to each trial's state:

- ``MulticlassStatScores`` and the classes that only change its ``compute`` (``MulticlassAccuracy``,
  ``MulticlassPrecision``, ``MulticlassRecall``, ``MulticlassF1Score``, ...): ``top_k=1``, global
  averaging, no ``ignore_index``; the counts are integers, so they are exact;
- ``MeanMetric`` updated with one scalar per trial and no weight (``self.train_loss(loss)``): the state
  grows by that value and the weight by one, as in ``MeanMetric.update``.

Each rule reads the metric's configuration (``num_classes``, ``top_k``, ``average``, ...; ``nan_strategy`` and
``dtype``), which trials may set differently (``MulticlassAccuracy(top_k=k)`` with ``k`` a hyperparameter): the
trials are batched in groups of one class and one configuration, each group by its own. Inputs or configurations
these rules do not cover, or that torchmetrics would reject or clean (labels out of range, NaN), are left to the
per-trial replay, which raises or warns exactly as the trial's own metric does.

Example::

    >>> import torch, torchmetrics
    >>> trials = [torchmetrics.Accuracy(task="multiclass", num_classes=3) for _ in range(2)]
    >>> preds, target = torch.tensor([[0, 1, 2], [0, 0, 0]]), torch.tensor([[0, 1, 1], [0, 1, 2]])
    >>> update_all(trials, (preds, target), {})
    {0, 1}
    >>> [round(float(m.compute()), 4) for m in trials]
    [0.6667, 0.3333]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["update_all"]


def update_all(metrics: Sequence[nn.Module], args: tuple[Any, ...], kwargs: dict[str, Any]) -> set[int]:
    """Apply ``metric_b.update(*row b of args)`` to the trials' metrics at once, where a batched rule covers it.

    Args:
        metrics: each trial's metric (one per row).
        args: the update's positional arguments, tensors stacked ``[B, ...]`` over the trials.
        kwargs: its keyword arguments, stacked the same way.

    Returns:
        The rows whose update was applied (the others are unchanged: replay them per trial).
    """
    groups: dict[tuple[Any, ...], list[int]] = {}
    for row, metric in enumerate(metrics):
        configuration = _configuration(metric)
        if configuration is not None:
            groups.setdefault(configuration, []).append(row)
    done: set[int] = set()
    for configuration, rows in groups.items():
        members, own_args, own_kwargs = [metrics[row] for row in rows], args, kwargs
        if len(rows) < len(metrics):  # the group's rows of each stacked argument
            index = torch.tensor(rows)
            own_args, own_kwargs = _rows(args, index), _rows(kwargs, index)
        if configuration[0] == "stat_scores":
            applied = len(args) + len(kwargs) == 2 and _stat_scores(members, *own_args, **own_kwargs)
        else:
            applied = len(args) == 1 and not kwargs and _mean(members, own_args[0])
        if applied:
            done.update(rows)
    return done


def _configuration(metric: Any) -> tuple[Any, ...] | None:
    """What a batched rule reads from ``metric`` besides its state (trials batched together share it); None: no rule."""
    from torchmetrics import MeanMetric
    from torchmetrics.classification import MulticlassStatScores

    if isinstance(metric, MulticlassStatScores) and type(metric).update is MulticlassStatScores.update:
        return (
            "stat_scores",
            type(metric),
            metric.num_classes,
            metric.top_k,
            metric.average,
            metric.multidim_average,
            metric.ignore_index,
        )
    if type(metric) is MeanMetric:
        return ("mean", metric.nan_strategy, metric.dtype)
    return None


def _rows(value: Any, index: Tensor) -> Any:
    """``value`` with each tensor cut to the rows ``index`` (the arguments of a group of trials)."""
    if isinstance(value, Tensor):
        return value.index_select(0, index.to(value.device))
    if isinstance(value, (list, tuple)):
        items = [_rows(v, index) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: _rows(v, index) for k, v in value.items()}
    return value


def _count(metric: Any) -> None:
    """What torchmetrics' update wrapper does besides the update: forget the cached result, count the call."""
    metric._computed = None
    metric._update_count += 1


def _stat_scores(metrics: Sequence[nn.Module], preds: Any, target: Any) -> bool:
    first: Any = metrics[0]  # the group's configuration
    classes = first.num_classes
    if not (first.top_k == 1 and first.multidim_average == "global" and first.ignore_index is None and classes) or not (
        isinstance(preds, Tensor) and isinstance(target, Tensor)
    ):
        return False
    rows = len(metrics)
    if target.is_floating_point() or target.dim() < 2 or target.shape[0] != rows or target[0].numel() == 0:
        return False
    if preds.dim() == target.dim() + 1 and preds.is_floating_point() and preds.shape[2] == classes:
        preds = preds.argmax(dim=2)  # torchmetrics' format step: logits or probabilities to labels
    elif preds.shape != target.shape or preds.is_floating_point() or bool(((preds < 0) | (preds >= classes)).any()):
        return False
    if preds.shape[1:] != target.shape[1:] or bool(((target < 0) | (target >= classes)).any()):
        return False
    preds, target = preds.reshape(rows, -1), target.reshape(rows, -1)
    if first.average == "micro":
        correct = preds == target
        tp = correct.sum(1)
        fp = (~correct).sum(1)
        fn = fp
        tn = classes * preds.shape[1] - (fp + fn + tp)
    else:  # per class, from each trial's confusion matrix (one bincount over all trials)
        mapping = target.long() * classes + preds.long()
        offsets = torch.arange(rows, device=mapping.device).unsqueeze(1) * classes**2
        confusion = torch.bincount((mapping + offsets).flatten(), minlength=rows * classes**2)
        confusion = confusion.reshape(rows, classes, classes)
        tp = confusion.diagonal(dim1=1, dim2=2)
        fp = confusion.sum(1) - tp
        fn = confusion.sum(2) - tp
        tn = confusion.sum((1, 2)).unsqueeze(1) - (fp + fn + tp)
    for row, metric in enumerate(metrics):
        _count(metric)
        metric._update_state(tp[row], fp[row], tn[row], fn[row])  # type: ignore[operator]
    return True


def _mean(metrics: Sequence[nn.Module], value: Any) -> bool:
    first: Any = metrics[0]  # the group's configuration
    if not isinstance(value, Tensor) or not value.is_floating_point() or value.shape != (len(metrics),):
        return False
    if first.nan_strategy != "disable" and bool(torch.isnan(value).any()):
        return False  # torchmetrics removes (or rejects) NaN with a warning: the per-trial replay does that
    value = value.to(first.dtype)
    weight = torch.ones_like(value)
    increments = value * weight  # MeanMetric.update: (value * weight).sum(), one element per trial
    for row, metric in enumerate(metrics):
        _count(metric)
        mean: Any = metric  # torchmetrics' states are plain attributes, unknown to nn.Module's typing
        mean.mean_value += increments[row]
        mean.weight += weight[row]
    return True
