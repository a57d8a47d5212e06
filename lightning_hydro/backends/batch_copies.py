"""One batch, several runs of the trials' code: each run gets the batch as the loader gave it.

Alone, a trial's step has its batch to itself, and code written that way changes it: it rebinds an entry
(``batch["x"] = (batch["x"] - mean) / std``) or changes a tensor in place (``x.sub_(mean)``). In a fused group one
batch meets several runs: each trial's step on the ``loop`` backend, and on the first batch the timing runs of
``backend="auto"`` and the first-batch check. Before, each run got the batch the runs before it had changed: every
later trial normalised the normalised batch again (trials 0.08 and 0.39 relative from alone on the loop, a loss of
62 instead of 2.3 under vmap after the check's runs).

- :func:`containers_copied`: the batch's dicts, lists, tuples and dataclasses made anew around the same tensors
  (a rebound entry stays in the run's own copy; no tensor is copied);
- :func:`tensors_copied`: the same with every tensor cloned (a run that must leave no trace: a check, a timing run);
- :class:`BatchRuns`: the batch for each of several runs in turn: the loader's own tensors while no run has changed
  one in place (read off the tensors' version counters), fresh copies of them as they came after one has;
- :func:`batch_tensors`: the batch's tensors (a compiled step's check puts them back before its eager run);
- :func:`first_difference`: where two runs' batches differ (the trials' batch-transfer hooks must give one batch).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor

__all__ = ["BatchRuns", "batch_tensors", "containers_copied", "first_difference", "tensors_copied"]

_LEAVES = frozenset({Tensor, int, float, bool, str, type(None)})  # (a Parameter is a Tensor's subclass: not here)


def containers_copied(batch: Any) -> Any:
    """``batch`` with its containers (dicts, lists, tuples, named tuples, dataclasses) new, its tensors the same."""
    kind = type(batch)
    if kind in _LEAVES:
        return batch
    if kind is tuple or kind is list:  # the common batches, made anew here at a third of the general way's cost
        return kind(containers_copied(value) for value in batch)
    if kind is dict:
        return {key: containers_copied(value) for key, value in batch.items()}
    return apply_to_collection(batch, Tensor, _same)


def tensors_copied(batch: Any) -> Any:
    """``batch`` with new containers and every tensor cloned."""
    return apply_to_collection(batch, Tensor, Tensor.clone)


def first_difference(a: Any, b: Any, where: str = "batch") -> str | None:
    """Where batch ``b`` first differs from ``a`` and how (``"batch[0]: tensor values differ"``), or None if equal.

    Equal: the same structure (containers of the same kinds, keys and lengths, dataclasses field by field), tensors
    of the same shape, dtype and device and equal values (``torch.equal``), other values ``==``.

    Example::

        >>> first_difference({"x": torch.ones(2), "n": 3}, {"x": torch.zeros(2), "n": 3})
        "batch['x']: tensor values differ"
    """
    if type(a) is not type(b):
        return f"{where}: a {type(a).__name__} against a {type(b).__name__}"
    if isinstance(a, Tensor):
        for what in ("shape", "dtype", "device"):
            if getattr(a, what) != getattr(b, what):
                return f"{where}: {what} {getattr(a, what)} against {getattr(b, what)}"
        return None if torch.equal(a, b) else f"{where}: tensor values differ"
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: {len(a)} entries against {len(b)}"
        pairs = [(f"{where}[{index}]", x, y) for index, (x, y) in enumerate(zip(a, b))]
    elif isinstance(a, dict):
        if list(a) != list(b):
            return f"{where}: keys {list(a)} against {list(b)}"
        pairs = [(f"{where}[{key!r}]", a[key], b[key]) for key in a]
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        pairs = [(f"{where}.{f.name}", getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)]
    else:
        return None if _equal(a, b) else f"{where}: {a!r} against {b!r}"[:200]
    return next((found for path, x, y in pairs if (found := first_difference(x, y, path)) is not None), None)


def _equal(a: Any, b: Any) -> bool:
    """``a == b`` where that is a truth value, else their attributes compared (objects without ``__eq__``)."""
    try:
        equal = a == b
        if isinstance(equal, bool) and (equal or not hasattr(a, "__dict__")):
            return equal
    except Exception:  # e.g. numpy arrays of several elements
        pass
    if hasattr(a, "__dict__") and hasattr(b, "__dict__"):
        return first_difference(vars(a), vars(b)) is None
    return False


def _same(tensor: Tensor) -> Tensor:
    return tensor


def batch_tensors(batch: Any) -> list[Tensor]:
    """The tensors in ``batch`` (a compiled step's check puts them back before its eager run: they may be written)."""
    found: list[Tensor] = []
    apply_to_collection(batch, Tensor, found.append)
    return found


class BatchRuns:
    """The batch for each of several runs of the trials' code, every one as the loader gave it.

    The first run, and every later one while no run has changed a tensor in place, gets the loader's own tensors in
    containers of its own; once one has, each later run gets copies taken before the first run. So a step that
    rebinds its batch's entries costs nothing, and one that writes into them costs a copy of the batch per step
    (kept only while the batch holds tensors and more than one run follows). Inference tensors (an evaluation
    batch) count no versions: each run after the first gets copies of them.

    Args:
        batch: the batch (any nesting of containers and tensors).
        runs: how many runs will ask for it.
    """

    def __init__(self, batch: Any, runs: int) -> None:
        self._batch = batch
        self._tensors = batch_tensors(batch) if runs > 1 else []
        # an inference tensor (a batch made under torch.inference_mode, as Lightning's evaluation loops do) has no
        # version counter: a run may have written into it unseen, so each run after the first gets copies
        self._changed = any(t.is_inference() for t in self._tensors)
        self._versions = [] if self._changed else [t._version for t in self._tensors]
        self._kept = tensors_copied(batch) if self._tensors else None  # as it came, for the runs after a change
        self._first = True

    def next(self) -> Any:
        """The batch for the next run."""
        first, self._first = self._first, False
        if not self._changed and self._tensors:
            self._changed = any(t._version != v for t, v in zip(self._tensors, self._versions))
        if self._changed and not first:
            return tensors_copied(self._kept)
        return containers_copied(self._batch)
