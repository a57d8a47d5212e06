"""torchmetrics inside a vmapped step: record each metric call, replay it on each trial's own metric afterwards.

A ``torchmetrics.Metric`` keeps its state in Python attributes and validates its inputs with data-dependent
Python (``if (preds < 0).any(): raise ...``, NaN checks), which ``vmap`` rejects; and one template metric
cannot hold B trials' states. So while the user's step runs under vmap, every ``Metric`` and
``MetricCollection`` of the template *records* its ``update`` / ``forward`` calls instead of running them: the
call's tensor arguments leave the vmapped function as ``[B, ...]`` outputs, and afterwards each trial's OWN
metric is called with its row of them (``metric_b.forward(preds[b], target[b])``). That is the call the
trial would have made alone, on the same values, so each trial's metric state equals its unfused state
exactly, for any metric class.

Inside the step, what ``metric(preds, target)`` returns is a :class:`DeferredValue`: the step may log it
(``self.log("acc", self.acc(preds, y))``; it is replaced by each trial's batch value after the replay) or
ignore it, but computing with it raises a :class:`~lightning_hydro.backends.errors.FusionError` that names
the metric and the fix. ``compute()`` and ``reset()`` inside a vmapped step are refused the same way.

Example::

    >>> import torch, torchmetrics
    >>> from torch import nn
    >>> template = nn.Module()
    >>> template.acc = torchmetrics.MeanMetric()
    >>> trials = [template, nn.Module()]
    >>> trials[1].acc = torchmetrics.MeanMetric()
    >>> recorder = MetricRecorder(template)
    >>> def step(x):  # runs for both trials at once
    ...     with recorder.recording():
    ...         template.acc(x.sum())
    ...     return recorder.tensors()
    >>> captured = torch.vmap(step)(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    >>> _ = recorder.replay(captured, trials)
    >>> [float(t.acc.compute()) for t in trials]
    [3.0, 7.0]
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

from torch import Tensor, nn

from lightning_hydro.backends.batched_metrics import update_all
from lightning_hydro.backends.errors import FusionError

__all__ = [
    "DeferredValue",
    "MetricCall",
    "MetricRecorder",
    "deferred_note",
    "metric_paths",
    "preserved_metric_states",
    "update_suffices",
]

_RECORDED = ("forward", "update")
_REFUSED = ("compute", "reset")
_MISSING = object()
_DICT_READS = ("items", "keys", "values", "get")  # what log_dict and dict-reading code call on a returned dict


def _metric_classes() -> tuple[type, ...]:
    """The classes ``Metric`` and ``MetricCollection`` of torchmetrics (none if never imported)."""
    if "torchmetrics" not in sys.modules:  # importing it here would load it for every user (the backends stay light)
        return ()
    from torchmetrics import Metric, MetricCollection

    return (Metric, MetricCollection)


def metric_paths(module: nn.Module) -> dict[int, str]:
    """``id(object) -> path`` of every ``Metric`` and ``MetricCollection`` inside ``module``."""
    classes = _metric_classes()
    if not classes:
        return {}
    return {id(m): path for path, m in module.named_modules() if isinstance(m, classes)}


def _refusal(path: str, what: str) -> FusionError:
    return FusionError(
        f"backend='vmap'/'hfta': the step {what} torchmetrics metric {path!r} inside the vectorised step, where each "
        "trial's metric is only updated after the step (its calls are replayed per trial). Log the metric object "
        f"(self.log(name, self.{path})) or the value it returns, compute with torchmetrics.functional instead, or use "
        "backend='loop'."
    )


def _dict_refusal(path: str, metric_class: str) -> FusionError:
    return FusionError(
        f"backend='vmap'/'hfta': the step reads the dict that {metric_class}.forward returns ({path}(...)), e.g. "
        f"self.log_dict(self.{path}(...)), inside the vectorised step, where each trial's metric is only updated after "
        "the step (its calls are replayed per trial): its keys and values do not exist yet. Update the metric in the "
        f"step (self.{path}.update(...)) and log its dict in the epoch-end hook (self.log_dict(self.{path}.compute()), "
        f"then self.{path}.reset()), or use backend='loop' to log each batch's dict. (A MetricCollection's dict can be "
        "logged from the step.)"
    )


class DeferredValue:
    """What ``metric(...)`` returns inside a vmapped step: each trial's value exists only after the step.

    It may be logged or ignored; any other use raises a ``FusionError`` that names the metric and the fix (a dict's
    reads, as ``log_dict`` makes them, with the fix for a metric that returns a dict).
    """

    def __init__(self, path: str, metric_class: str, call: int, key: str | None = None) -> None:
        self.path, self.metric_class, self.call, self.key = path, metric_class, call, key

    def refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Raise the error for a use of the value inside the vectorised step."""
        raise _refusal(self.path, f"uses the value that {self.metric_class}.forward returns ({self.path}(...))")

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        deferred = next(a for a in (*args, *(kwargs or {}).values()) if isinstance(a, DeferredValue))
        deferred.refuse()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # protocol probes (copy, pickle, hasattr) get the usual answer
            raise AttributeError(name)
        if name in _DICT_READS:  # a metric whose forward returns a dict (ClasswiseWrapper, MultitaskWrapper, ...)
            raise _dict_refusal(self.path, self.metric_class)
        self.refuse()

    def __getitem__(self, key: Any) -> NoReturn:
        if isinstance(key, str):
            raise _dict_refusal(self.path, self.metric_class)
        self.refuse()

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = refuse
    __pow__ = __neg__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __float__ = __int__ = __index__ = refuse
    __len__ = __iter__ = __eq__ = __ne__ = __abs__ = __round__ = __floordiv__ = __mod__ = refuse
    __rfloordiv__ = __rmod__ = __matmul__ = __rmatmul__ = __rpow__ = refuse
    __hash__ = object.__hash__  # identity, as before __eq__ was refused


@dataclass
class MetricCall:
    """One recorded call: the metric's path, the method, and the call's arguments with tensors taken out."""

    path: str
    method: str
    structure: Any  # (args, kwargs) with each tensor replaced by its index in the recorded tensors
    first: int  # index of the call's first tensor
    count: int  # how many tensors the call has


def _take_tensors(value: Any, out: list[Tensor]) -> Any:
    if isinstance(value, Tensor):
        out.append(value.detach())
        return _TensorSlot(len(out) - 1)
    if isinstance(value, (list, tuple)):
        items = [_take_tensors(v, out) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: _take_tensors(v, out) for k, v in value.items()}
    return value


def _put_tensors(structure: Any, tensors: Sequence[Tensor], row: int | None) -> Any:
    """The call's arguments with row ``row`` of each recorded tensor (None: the whole ``[B, ...]`` tensor)."""
    if isinstance(structure, _TensorSlot):
        return tensors[structure.index] if row is None else tensors[structure.index][row]
    if isinstance(structure, (list, tuple)):
        items = [_put_tensors(v, tensors, row) for v in structure]
        return items if isinstance(structure, list) else tuple(items)
    if isinstance(structure, dict):
        return {k: _put_tensors(v, tensors, row) for k, v in structure.items()}
    return structure


@dataclass(frozen=True)
class _TensorSlot:
    index: int


class MetricRecorder:
    """Records the metric calls of one template module's step and replays them on each trial's metrics.

    Args:
        template: the module whose code runs under vmap (the metrics are found by path, so a converted copy
            of the trial modules works too).
    """

    def __init__(self, template: nn.Module) -> None:
        self.template = template
        self.paths = metric_paths(template)
        # walked once: named_modules() hashes each module, and a torchmetrics Metric hashes its whole state
        self._metrics = [(path, template.get_submodule(path)) for path in self.paths.values()]
        self._trial_metrics: dict[tuple[int, str], list[nn.Module]] = {}
        self.calls: list[MetricCall] = []
        self._tensors: list[Tensor] = []
        # the stand-ins, made once: a compiled step sees the same objects at every step (no new guard to fail)
        self._stand_ins: list[tuple[nn.Module, str, Any]] = []
        for path, metric in self._metrics:
            self._stand_ins += [(metric, method, _bind(self._record, path, metric, method)) for method in _RECORDED]
            self._stand_ins += [
                (metric, method, _refuse_call(path, f"calls {type(metric).__name__}.{method}() of"))
                for method in _REFUSED
            ]

    def tensors(self) -> tuple[Tensor, ...]:
        """The tensors the recorded calls received (return them from the vmapped function), handed over once.

        The recorder lets go of them: inside ``vmap`` they are batched tensors of the mapped call, which must not
        outlive it (a compiled step could not hand them back: its graph's outputs are plain tensors).
        """
        tensors, self._tensors = tuple(self._tensors), []
        return tensors

    @property
    def metric_names(self) -> list[str]:
        """Paths of the metrics called in the last recorded step, in call order, without repeats."""
        return list(dict.fromkeys(call.path for call in self.calls))

    def _record(self, path: str, metric: nn.Module, method: str, *args: Any, **kwargs: Any) -> Any:
        first = len(self._tensors)
        structure = _take_tensors((args, kwargs), self._tensors)
        self.calls.append(MetricCall(path, method, structure, first, len(self._tensors) - first))
        if method == "update":
            return None
        call, name = len(self.calls) - 1, type(metric).__name__
        if isinstance(metric, nn.ModuleDict):  # a MetricCollection: forward returns a value per member metric
            keys = metric.keys(keep_base=False)  # type: ignore[call-arg]
            return {str(key): DeferredValue(path, name, call, str(key)) for key in keys}
        return DeferredValue(path, name, call)

    def restart(self) -> None:
        """Forget the recorded calls: a new step (or, chunked, a new chunk of rows) records afresh."""
        self.calls, self._tensors = [], []

    @contextmanager
    def recording(self) -> Iterator[None]:
        """While active, the template's metrics record ``forward``/``update`` calls and refuse ``compute``/``reset``.

        The recorders are instance attributes that shadow the metric's methods for the duration of the block;
        the previous attributes are restored on exit, also when the block raises. Under ``torch.compile`` enter it
        outside the compiled function and call :meth:`restart` inside (torch 2.11's dynamo cannot trace the
        attributes' removal).
        """
        self.restart()
        saved = [(metric, method, metric.__dict__.get(method, _MISSING)) for metric, method, _ in self._stand_ins]
        try:
            for metric, method, stand_in in self._stand_ins:
                metric.__dict__[method] = stand_in
            yield
        finally:
            for metric, method, previous in reversed(saved):
                if previous is _MISSING:
                    metric.__dict__.pop(method, None)
                else:
                    metric.__dict__[method] = previous

    def replay(
        self, tensors: Sequence[Tensor], modules: Sequence[nn.Module], *, needed: Collection[int] = ()
    ) -> list[list[Any]]:
        """Call each trial's own metrics as the step called the template's: ``results[call][row]``.

        A ``forward`` whose value the step did not log (its index not in ``needed``) is replayed as ``update``
        where that leaves the same state (see :func:`update_suffices`), skipping forward's extra work.

        Args:
            tensors: the recorded tensors as the vmapped function returned them, ``[B, ...]`` each.
            modules: the trial modules, one per row.
            needed: indices of the calls whose returned values are used (logged).
        """
        results: list[list[Any]] = [[] for _ in self.calls]
        methods = [
            "update"
            if call.method == "forward"
            and index not in needed
            and update_suffices(self.template.get_submodule(call.path))
            else call.method
            for index, call in enumerate(self.calls)
        ]
        # call by call (each trial still sees its calls in the step's order): the trials whose metrics a batched rule
        # covers at once, a group per configuration (lightning_hydro/backends/batched_metrics.py), the rest one by one
        for index, call in enumerate(self.calls):
            metrics = self.trial_metrics(call.path, modules)
            batched = (
                update_all(metrics, *_put_tensors(call.structure, tensors, None)) if methods[index] == "update" else ()
            )
            for row, metric in enumerate(metrics):
                if row in batched:
                    results[index].append(None)
                    continue
                args, kwargs = _put_tensors(call.structure, tensors, row)
                results[index].append(getattr(metric, methods[index])(*args, **kwargs))
        return results

    def calls_of(self, metrics: Sequence[nn.Module]) -> set[int]:
        """The indices of the recorded ``forward`` calls of the template's ``metrics`` (or of a collection of them)."""
        paths = [self.paths[id(metric)] for metric in metrics if id(metric) in self.paths]
        return {
            index
            for index, call in enumerate(self.calls)
            if call.method == "forward" and any(p == call.path or p.startswith(f"{call.path}.") for p in paths)
        }

    def per_row_value(self, value: Any, results: list[list[Any]], modules: Sequence[nn.Module]) -> Any:
        """What a logged value stands for per row: each trial's metric object, or each trial's batch value.

        Returns None if ``value`` is neither a metric of the template nor a deferred value.
        """
        if isinstance(value, DeferredValue):
            per_row = results[value.call]
            return [row[value.key] if value.key is not None else row for row in per_row]
        if isinstance(value, nn.Module) and id(value) in self.paths:
            return self.trial_metrics(self.paths[id(value)], modules)
        return None

    def trial_metrics(self, path: str, modules: Sequence[nn.Module]) -> list[nn.Module]:
        """Each trial module's metric at ``path`` (cached per group of modules)."""
        key = (hash(tuple(id(m) for m in modules)), path)
        if key not in self._trial_metrics:
            self._trial_metrics[key] = [module.get_submodule(path) for module in modules]
        return self._trial_metrics[key]


def update_suffices(metric: nn.Module) -> bool:
    """Whether ``metric.update(x)`` leaves the state that ``metric(x)`` (forward) leaves, for any state before.

    torchmetrics' forward (with ``full_state_update=False``) updates a reset copy and merges it into the
    accumulated state with each state's reduction: for sum, max, min and cat that is what ``update`` does on
    the accumulated state directly, for torchmetrics' own metrics (whose updates add, take the max, append).
    A user's metric class is always replayed as the step called it.
    """
    from torchmetrics.utilities.data import dim_zero_cat, dim_zero_max, dim_zero_min, dim_zero_sum

    merged_like_update = (dim_zero_sum, dim_zero_max, dim_zero_min, dim_zero_cat)
    return (
        isinstance(metric, _metric_classes()[:1])
        and type(metric).__module__.startswith("torchmetrics.")
        and getattr(metric, "full_state_update", None) is False
        and not getattr(metric, "dist_sync_on_step", True)
        and not getattr(metric, "compute_on_cpu", True)
        # torchmetrics keeps each state's reduction in _reductions (no public accessor)
        and all(fx in merged_like_update for fx in getattr(metric, "_reductions", {None: None}).values())
    )


def _bind(record: Any, path: str, metric: nn.Module, method: str) -> Any:
    def recorder(*args: Any, **kwargs: Any) -> Any:
        return record(path, metric, method, *args, **kwargs)

    return recorder


def _refuse_call(path: str, what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise _refusal(path, what)

    return refuse


@contextmanager
def preserved_metric_states(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Put every torchmetrics metric of ``modules`` back as it was after the block (trial steps run to time or check).

    torchmetrics has no public way to save and restore a metric's accumulated state, so its counters
    (``_update_count``, ``_computed``, ``_forward_cache``) and a collection's compute-group flags are saved
    by name alongside the states listed by the public ``metric_state``.
    """
    saved: list[tuple[nn.Module, dict[str, Any]]] = []
    classes = _metric_classes()
    for module in modules if classes else ():
        for m in module.modules():
            if isinstance(m, classes[0]):
                states: dict[str, Any] = getattr(m, "metric_state")  # noqa: B009 - nn.Module's typing hides it
                state = {name: _clone(value) for name, value in states.items()}
                for name in ("_update_count", "_computed", "_forward_cache"):
                    state[name] = getattr(m, name)
                saved.append((m, state))
            elif isinstance(m, classes[1]):
                flags = ("_groups_checked", "_groups", "_state_is_copy")
                saved.append((m, {name: _clone(getattr(m, name)) for name in flags if hasattr(m, name)}))
    try:
        yield
    finally:
        for m, state in saved:
            for name, value in state.items():
                setattr(m, name, value)


def _clone(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.clone()
    if isinstance(value, list):
        return [_clone(v) for v in value]
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def deferred_note(backend: object) -> str:
    """A clause for the backend report naming the metrics a fused backend replays per trial ("" if none)."""
    names: list[str] = getattr(backend, "deferred_metrics", [])
    if not names:
        return ""
    return (
        f"; torchmetrics {', '.join(names)} run per trial after each fused step "
        "(the step's calls applied to each trial's own metric: batched where a rule covers them, else replayed)"
    )
