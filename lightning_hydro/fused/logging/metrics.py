"""Per-trial aggregation of logged values: the last step value and the epoch reduction of each metric.

Lightning's ``self.log`` costs about half a millisecond per key per step, so B trials times K metrics
cannot go through it every step. The fused module records each step's values here as ``[B]`` tensors
(one tensor op per metric, whatever B is) and hands Lightning only the per-trial *epoch* values through
``self.log``, once per epoch; the step values go into the Trainer's metric dictionaries as device tensors, and to
the loggers at the Trainer's logging interval (:mod:`.publisher`).

Each value is kept under the name Lightning gives it (:mod:`.names`): a validation or test value of one of
several dataloaders under ``"{name}/dataloader_idx_{i}"`` (:attr:`TrialMetrics.dataloader_idx`, set per evaluation
batch as Lightning sets it), so each loader's values are reduced apart; a step value under ``"{name}_step"`` where
the value is logged on epoch level too (the epoch value's ``"{name}_epoch"``: :meth:`TrialMetrics.names_of`).

Slots can change mid-epoch (a trial stopped, another added): :meth:`TrialMetrics.reslot` folds the rows
accumulated so far into per-trial partial results, so each trial's epoch value covers exactly the
batches it trained on.

Under several processes (DDP) a value logged with ``sync_dist=True`` is reduced across them as Lightning
reduces it: a step value when it is recorded, an epoch value when it is read (weighted sums and batch sizes
summed over every rank, so a mean is the mean over all the data). Every rank holds the same trials, so each
reduction is one collective per metric, whatever the number of trials. :attr:`TrialMetrics.reduce` is set by
the fused module when it runs on more than one process.

Example::

    >>> import torch
    >>> metrics = TrialMetrics()
    >>> opts = MetricOptions(on_step=False, on_epoch=True)
    >>> metrics.record("validate", "acc", torch.tensor([0.5, 1.0]), opts, trial_ids=[3, 7], batch_size=10)
    >>> metrics.record("validate", "acc", torch.tensor([1.0, 1.0]), opts, trial_ids=[3, 7], batch_size=30)
    >>> metrics.finish_epoch("validate")
    {3: {'acc': 0.875}, 7: {'acc': 1.0}}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from lightning.pytorch.utilities.data import extract_batch_size
from torch import Tensor

from lightning_hydro.backends import StackedLog
from lightning_hydro.fused.logging.names import LightningNames, lightning_names

__all__ = [
    "MetricOptions",
    "ReduceFx",
    "Reducer",
    "StepValue",
    "TrialMetrics",
    "record_step_logs",
    "resolve_options",
]

ReduceFx = Literal["mean", "sum", "max", "min"]
# Reduces a tensor element-wise across the processes of a distributed run ("mean", "sum", "max" or "min").
Reducer = Callable[[Tensor, ReduceFx], Tensor]

# Lightning's defaults for on_step / on_epoch depend on the hook that logs.
_STEP_HOOKS = dict.fromkeys(
    (
        "training_step",
        "on_train_batch_start",
        "on_train_batch_end",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_before_zero_grad",
    ),
    (True, False),
)
_EPOCH_DEFAULT = (False, True)


@dataclass(frozen=True)
class MetricOptions:
    """How a logged value is aggregated and where it goes (the subset of ``self.log``'s options that matter)."""

    on_step: bool = False
    on_epoch: bool = True
    reduce_fx: ReduceFx = "mean"
    logger: bool = True
    prog_bar: bool = False
    sync_dist: bool = False
    add_dataloader_idx: bool = True


def resolve_options(hook: str, options: dict[str, Any]) -> MetricOptions:
    """Fill in Lightning's hook-dependent defaults and normalise ``reduce_fx``.

    Raises:
        ValueError: for a ``reduce_fx`` other than mean/sum/max/min (or torch.mean/sum/max/min).
    """
    default_step, default_epoch = _STEP_HOOKS.get(hook, _EPOCH_DEFAULT)
    on_step = options.get("on_step")
    on_epoch = options.get("on_epoch")
    reduce_fx = options.get("reduce_fx", "mean")
    if callable(reduce_fx):
        reduce_fx = getattr(reduce_fx, "__name__", repr(reduce_fx))
    if reduce_fx not in ("mean", "sum", "max", "min"):
        raise ValueError(
            f"self.log(reduce_fx={reduce_fx!r}) is not supported for fused trials; use 'mean', 'sum', 'max' or "
            "'min' (or torch.mean/sum/max/min)."
        )
    logger = options.get("logger")
    return MetricOptions(
        on_step=default_step if on_step is None else bool(on_step),
        on_epoch=default_epoch if on_epoch is None else bool(on_epoch),
        reduce_fx=reduce_fx,
        logger=True if logger is None else bool(logger),
        prog_bar=bool(options.get("prog_bar", False)),
        sync_dist=bool(options.get("sync_dist", False)),
        add_dataloader_idx=bool(options.get("add_dataloader_idx", True)),
    )


_COMBINE: dict[str, Callable[[float, float], float]] = {
    "mean": lambda a, b: a + b,
    "sum": lambda a, b: a + b,
    "max": max,
    "min": min,
}


@dataclass
class _Accumulator:
    """Epoch accumulation of one metric: the current rows as tensors, earlier rows folded per trial."""

    options: MetricOptions
    dataloader_idx: int | None = None  # the evaluation loader it was first logged from
    trial_ids: list[int] = field(default_factory=list)
    total: Tensor | None = None
    weight: Tensor | None = None
    folded: dict[int, tuple[float, float]] = field(default_factory=dict)

    def add(self, values: Tensor, trial_ids: Sequence[int], batch_size: int) -> None:
        if list(trial_ids) != self.trial_ids:
            self.fold()
            self.trial_ids = list(trial_ids)
        values = values.detach().to(torch.float64)
        reduce_fx = self.options.reduce_fx
        if self.total is None or self.weight is None:
            self.total = values * batch_size if reduce_fx == "mean" else values.clone()
            self.weight = torch.full_like(values, float(batch_size))
        elif reduce_fx == "mean":
            self.total += values * batch_size
            self.weight += batch_size
        elif reduce_fx == "sum":
            self.total += values
        elif reduce_fx == "max":
            self.total = torch.maximum(self.total, values)
        else:
            self.total = torch.minimum(self.total, values)

    def fold(self) -> None:
        if self.total is None or self.weight is None:
            return
        combine = _COMBINE[self.options.reduce_fx]
        for tid, total, weight in zip(self.trial_ids, self.total.tolist(), self.weight.tolist()):
            if tid in self.folded:
                old_total, old_weight = self.folded[tid]
                self.folded[tid] = (combine(old_total, total), old_weight + weight)
            else:
                self.folded[tid] = (total, weight)
        self.total = self.weight = None

    def result(self, reduce: Reducer | None = None) -> dict[int, float]:
        """Each trial's epoch value; with ``reduce``, over every process's batches (``sync_dist=True``)."""
        self.fold()
        folded = self.folded
        if reduce is not None and self.options.sync_dist:
            folded = _reduce_folded(folded, self.options.reduce_fx, reduce)
        if self.options.reduce_fx == "mean":
            return {tid: total / weight if weight else math.nan for tid, (total, weight) in folded.items()}
        return {tid: total for tid, (total, _) in folded.items()}


def _reduce_folded(
    folded: dict[int, tuple[float, float]], reduce_fx: ReduceFx, reduce: Reducer
) -> dict[int, tuple[float, float]]:
    """``(total, weight)`` per trial, combined over every process (all hold the same trials)."""
    tids = sorted(folded)
    pairs = torch.tensor([folded[tid] for tid in tids], dtype=torch.float64).reshape(len(tids), 2)
    if reduce_fx in ("mean", "sum"):
        pairs = reduce(pairs, "sum")  # weighted totals and batch sizes: the mean over all the data
    else:
        pairs = torch.stack([reduce(pairs[:, 0].contiguous(), reduce_fx), pairs[:, 1]], dim=1)
    return {tid: (float(total), float(weight)) for tid, (total, weight) in zip(tids, pairs.tolist())}


@dataclass(frozen=True)
class StepValue:
    """The latest step value of one ``on_step`` metric: ``values[i]`` belongs to ``trial_ids[i]``."""

    names: LightningNames
    options: MetricOptions
    trial_ids: list[int]
    values: Tensor
    dataloader_idx: int | None = None

    def per_trial(self) -> dict[int, Tensor]:
        """Each trial's value as a 0-dim tensor (views of the row: no value is read to the host)."""
        return dict(zip(self.trial_ids, self.values.reshape(len(self.trial_ids)).unbind(0)))


class TrialMetrics:
    """Aggregates per-trial logged values by phase ("train", "validate", "test") and metric name.

    The name of a value logged from an evaluation step of one of several dataloaders takes the loader's suffix
    (``"val_loss/dataloader_idx_1"``), as Lightning names it; :attr:`dataloader_idx` says which loader the current
    batch comes from.
    """

    def __init__(self) -> None:
        self._epoch: dict[str, dict[str, _Accumulator]] = {}
        self._step: dict[str, dict[str, StepValue]] = {}
        self._names: dict[tuple[str, str], LightningNames] = {}  # by phase and plain name
        self._made: dict[tuple[str, bool, int | None], LightningNames] = {}  # by name, forked, dataloader
        self._epoch_values: dict[str, dict[int, dict[str, float]]] = {}
        self._epoch_value_options: dict[str, dict[str, MetricOptions]] = {}
        self._objects: dict[str, dict[str, tuple[MetricOptions, dict[int, Any]]]] = {}
        self._double: set[tuple[str, str]] = set()  # (phase, plain name) of the epoch values logged as float64
        self.names: set[str] = set()  # every name logged so far, in any phase (the sanity check included)
        self.reduce: Reducer | None = None  # set when several processes train the group (sync_dist=True)
        self.unsynced: set[str] = set()  # epoch-level names logged without sync_dist=True under several processes
        # the evaluation dataloader of the current batch when there are several (Lightning passes its index only then),
        # else None: set by the fused module at each evaluation batch, as Lightning sets its result collection's
        self.dataloader_idx: int | None = None

    def names_of(self, phase: str, name: str) -> LightningNames:
        """Lightning's names of a value of ``phase`` (the step and epoch names of ``"loss"``: ``"loss_step"``, ...)."""
        return self._names.get((phase, name)) or lightning_names(name, forked=False)

    def _name(self, phase: str, name: str, options: MetricOptions) -> LightningNames:
        """The value's Lightning names, from the current dataloader; noted in :attr:`names`."""
        loader = self.dataloader_idx if options.add_dataloader_idx else None
        key = (name, options.on_step and options.on_epoch, loader)
        names = self._made.get(key)
        if names is None:  # made once per name and loader, not at every step
            names = self._made[key] = lightning_names(name, forked=key[1], dataloader_idx=loader)
            self.names.update((names.plain, names.step, names.epoch))
        accumulator = self._epoch.get(phase, {}).get(names.plain)
        if accumulator is not None and accumulator.dataloader_idx != self.dataloader_idx:
            raise ValueError(
                f"self.log({name!r}, add_dataloader_idx=False) was called from the steps of dataloaders "
                f"{accumulator.dataloader_idx} and {self.dataloader_idx} in one epoch, which Lightning refuses for one "
                "module too. Fix: log a name of its own per dataloader (e.g. f'{name}_{dataloader_idx}'), or leave "
                "add_dataloader_idx=True."
            )
        self._names[phase, names.plain] = names
        return names

    def record(
        self,
        phase: str,
        name: str,
        values: Tensor,
        options: MetricOptions,
        *,
        trial_ids: Sequence[int],
        batch_size: int = 1,
        epoch: bool = True,
    ) -> None:
        """Record one logged metric for the trials ``trial_ids`` (``values[i]`` belongs to ``trial_ids[i]``).

        ``epoch=False``: the step values only (a metric object's, whose epoch value is its ``compute()``).

        Raises:
            ValueError: for a name logged with ``add_dataloader_idx=False`` from two dataloaders in one epoch.
        """
        names = self._name(phase, name, options)
        if self.reduce is not None and options.on_epoch and not options.sync_dist:
            self.unsynced.add(names.plain)
        if options.on_step:
            step = values.detach()
            if self.reduce is not None and options.sync_dist:  # as Lightning syncs a step value: when logged
                step = self.reduce(step.to(torch.float64), options.reduce_fx).to(step.dtype)
            value = StepValue(names, options, list(trial_ids), step, self.dataloader_idx)
            self._step.setdefault(phase, {})[names.plain] = value
        if options.on_epoch and epoch:
            if values.dtype == torch.float64:
                self._double.add((phase, names.plain))
            accumulators = self._epoch.setdefault(phase, {})
            if names.plain not in accumulators:
                accumulators[names.plain] = _Accumulator(options, self.dataloader_idx)
            accumulators[names.plain].add(values, trial_ids, batch_size)

    def record_step(
        self, phase: str, hook: str, logs: Sequence[StackedLog], trial_ids: Sequence[int], batch: Any
    ) -> None:
        """Book what a fused step logged (row i belongs to ``trial_ids[i]``) under Lightning's options.

        ``hook`` is the step that logged (it sets ``on_step``/``on_epoch``'s defaults); ``batch`` gives an epoch mean's
        batch size where the step did not say. No value is read to the host.
        """
        batch_size: int | None = None
        for log in logs:
            options = resolve_options(hook, log.options)
            ids = trial_ids if log.rows is None else [trial_ids[row] for row in log.rows]  # some trials did not log
            if isinstance(log.values, list):  # per-trial objects (torchmetrics Metric): computed at epoch end
                # kept even on step only: Lightning resets every metric object logged in the epoch at its end
                self.record_objects(phase, log.name, dict(zip(ids, log.values)), options)
                if options.on_step:  # the value of the batch, as Lightning logs a metric object's step value
                    cached = [getattr(metric, "_forward_cache", None) for metric in log.values]
                    batch_values = [v for v in cached if isinstance(v, Tensor) and v.numel() == 1]
                    if len(batch_values) == len(cached):
                        values = torch.stack([v.detach().reshape(()).float() for v in batch_values])
                        self.record(phase, log.name, values, options, trial_ids=ids, epoch=False)
                continue
            size = log.options.get("batch_size")
            if size is None and options.on_epoch:  # only epoch means are weighted by the batch size
                if batch_size is None:
                    batch_size = extract_batch_size(batch)
                size = batch_size
            self.record(phase, log.name, log.values, options, trial_ids=ids, batch_size=size or 1)

    def record_objects(self, phase: str, name: str, objects: dict[int, Any], options: MetricOptions) -> None:
        """Record per-trial stateful metric objects (``compute()``/``reset()``, e.g. torchmetrics) logged by a step.

        Their value is computed once at the end of the epoch (``on_epoch=True`` only), then they are reset, as
        Lightning resets every metric object logged in the epoch, whatever ``on_step``/``on_epoch`` say.
        """
        name = self._name(phase, name, options).plain
        per_name = self._objects.setdefault(phase, {})
        _, known = per_name.get(name, (options, {}))
        per_name[name] = (options, {**known, **objects})

    def record_epoch_value(
        self,
        phase: str,
        name: str,
        values: dict[int, float],
        options: MetricOptions | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        """Record values that are already per-trial epoch results (logged from an epoch-end hook), logged as ``dtype``.

        With ``options.sync_dist`` they are reduced across processes (by ``options.reduce_fx``) when read.
        """
        self.names.add(name)
        if dtype == torch.float64:
            self._double.add((phase, name))
        per_trial = self._epoch_values.setdefault(phase, {})
        for tid, value in values.items():
            per_trial.setdefault(tid, {})[name] = value
        if options is not None and options.sync_dist:
            self._epoch_value_options.setdefault(phase, {})[name] = options

    def reslot(self) -> None:
        """Fold current rows into per-trial partials: call whenever the group's rows change.

        Step values stay: each is stored with the ids of its rows, so it stays right until the next step.
        """
        for accumulators in self._epoch.values():
            for accumulator in accumulators.values():
                accumulator.fold()

    def step_values(self, phase: str = "train", *, logger_only: bool = False) -> dict[int, dict[str, float]]:
        """The latest step value of every ``on_step`` metric of ``phase``, per trial, under its step name (one sync)."""
        out: dict[int, dict[str, float]] = {}
        for step in self._step.get(phase, {}).values():
            if logger_only and not step.options.logger:
                continue
            for tid, value in zip(step.trial_ids, step.values.reshape(len(step.trial_ids)).tolist()):
                out.setdefault(tid, {})[step.names.step] = value
        return out

    def latest_steps(self, phase: str = "train") -> list[StepValue]:
        """The latest step value of every ``on_step`` metric of ``phase``, on the device (nothing is read)."""
        return list(self._step.get(phase, {}).values())

    def forget_step_values(self, phase: str) -> None:
        """Drop ``phase``'s step values: an evaluation run starts without the last run's, as Lightning's does."""
        self._step.pop(phase, None)

    def is_double(self, phase: str, name: str) -> bool:
        """Whether ``phase``'s epoch value ``name`` was logged as float64 (``precision="64-true"``).

        Lightning logs its epoch value as float64 then, and the trial's is too (its Python float is float64 already).
        """
        return (phase, name) in self._double

    def epoch_options(self, phase: str) -> dict[str, MetricOptions]:
        """The options of each metric accumulated in ``phase`` this epoch."""
        options = {name: acc.options for name, acc in self._epoch.get(phase, {}).items()}
        options.update({name: opts for name, (opts, _) in self._objects.get(phase, {}).items() if opts.on_epoch})
        return options

    def epoch_so_far(self, phase: str) -> dict[int, dict[str, float]]:
        """The per-trial epoch values of ``phase`` so far, the accumulation left running."""
        out: dict[int, dict[str, float]] = {}
        for name, accumulator in self._epoch.get(phase, {}).items():
            for tid, value in accumulator.result(self.reduce).items():
                out.setdefault(tid, {})[name] = value
        for name, (options, objects) in self._objects.get(phase, {}).items():
            if not options.on_epoch:  # logged on step only: no epoch value, only the reset at the epoch's end
                continue
            for tid, metric in objects.items():
                out.setdefault(tid, {})[name] = float(metric.compute())  # torchmetrics syncs across processes
        for tid, values in self._epoch_values.get(phase, {}).items():
            out.setdefault(tid, {}).update(values)
        if self.reduce is not None:
            for name, options in self._epoch_value_options.get(phase, {}).items():
                tids = sorted(tid for tid, values in out.items() if name in values)
                local = torch.tensor([out[tid][name] for tid in tids], dtype=torch.float64)
                for tid, value in zip(tids, self.reduce(local, options.reduce_fx).tolist()):
                    out[tid][name] = value
        return out

    def finish_epoch(self, phase: str) -> dict[int, dict[str, float]]:
        """The per-trial epoch values of ``phase``; resets that phase's accumulation."""
        out = self.epoch_so_far(phase)
        self._epoch.pop(phase, None)
        for _, objects in self._objects.pop(phase, {}).values():
            for metric in objects.values():
                metric.reset()
        self._epoch_values.pop(phase, None)
        self._epoch_value_options.pop(phase, None)
        return out


def record_step_logs(
    metrics: TrialMetrics, phase: str, hook: str, logs: Sequence[StackedLog], trial_ids: Sequence[int], batch: Any
) -> None:
    """Book a fused step's logged values into ``metrics`` (:meth:`TrialMetrics.record_step`)."""
    metrics.record_step(phase, hook, logs, trial_ids, batch)
