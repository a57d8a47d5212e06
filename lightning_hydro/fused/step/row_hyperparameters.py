"""``RowHyperparameters``: the per-row scalars of a fused optimizer update, on the device, copied only on change.

B trials' optimizers hold their hyperparameters as Python numbers in ``param_groups`` (LR schedulers rewrite
``lr`` there, users may rewrite anything). The fused update needs them as ``[B, 1, ...]`` factors next to the
stacked ``[B, ...]`` tensors. Building them every step (``torch.tensor([...], device=cuda)``) would copy from
the host and make it wait for the GPU every step; so here:

- each step compares the param groups' raw values with those last copied (a list of tuples, compared on the
  host: a few microseconds, no device work);
- only when they differ are the factors recomputed on the host, in double precision as torch's optimizers
  compute their scalars (``1 - dampening``, ``-lr``, ...), and copied to the device in one transfer (from pinned
  memory, ``non_blocking``, on CUDA) into a persistent ``[K, P, B]`` table (K factors, P parameters, B rows),
  in the parameters' dtype (float32 for lower precisions, as torch applies its scalars);
- every step, the update writes this step's factors (:attr:`~RowHyperparameters.base`, with the skipped rows
  replaced by :attr:`~RowHyperparameters.neutral` values that leave those rows untouched) into a second
  persistent table, :attr:`~RowHyperparameters.table`, whose ``[B, 1, ...]`` views
  (:meth:`RowHyperparameters.views`) its ``torch._foreach_*`` calls read. The views never change, so the update
  is free of per-step Python work per row, and a captured CUDA graph can replay it.

Example::

    >>> import torch
    >>> params = [torch.zeros(2, 3), torch.zeros(2)]
    >>> table = RowHyperparameters(
    ...     ("lr",), lambda lr: (-lr,), {"neg_lr": 0.0}, group_of=[0, 0], params=params)
    >>> table.refresh([[{"lr": 0.1}], [{"lr": 0.2}]])  # first call: copied
    True
    >>> table.refresh([[{"lr": 0.1}], [{"lr": 0.2}]])  # unchanged: nothing to do
    False
    >>> _ = torch.where(torch.tensor([False, True]), table.neutral, table.base, out=table.table)  # row 1 skipped
    >>> table.views("neg_lr")[0].flatten().tolist()  # its factor leaves it as it is
    [-0.10000000149011612, 0.0]
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["RowHyperparameters", "factor_dtype"]


def factor_dtype(params: Sequence[Tensor]) -> torch.dtype:
    """The dtype of the ``[B, 1, ...]`` factors: float32 for low-precision parameters, as torch's scalars act."""
    dtypes = {p.dtype for p in params}
    return torch.float64 if torch.float64 in dtypes else torch.float32


def _host_dtype(device: torch.device) -> torch.dtype:
    """Double precision where the device has it (MPS has no float64)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _number(value: Any) -> Any:
    """A hyperparameter as a number: tensors (torch allows a tensor ``lr``) are read as floats."""
    if isinstance(value, tuple):
        return tuple(_number(v) for v in value)
    return float(value) if isinstance(value, Tensor) else value


def _holds_tensor(value: Any) -> bool:
    """A tensor may change in place (unseen by comparing the raw values): such factors are copied every step."""
    return isinstance(value, Tensor) or (isinstance(value, tuple) and any(isinstance(v, Tensor) for v in value))


class RowHyperparameters:
    """One ``[K, P, B]`` table of per-row factors on the device, refreshed from the param groups on change.

    Args:
        keys: the raw ``param_groups`` keys the factors are computed from, e.g. ``("lr", "momentum")``.
        derive: one group's raw values (in ``keys`` order) to its factors (in ``neutral`` order), as Python
            numbers; computed on the host, only when a value changed.
        neutral: each factor's name and the value that leaves a skipped row untouched (0 for an added term, 1
            for a multiplier).
        group_of: each parameter's param-group index (the same in every row); None: not optimized.
        params: the stacked parameters (their device, dtype and shape give the factors' views).
        doubles: factors also kept in double precision (:meth:`double`), for arithmetic on the device that torch
            does on the host in doubles (Adam's bias corrections).
    """

    def __init__(
        self,
        keys: Sequence[str],
        derive: Callable[..., Sequence[float]],
        neutral: Mapping[str, float],
        *,
        group_of: Sequence[int | None],
        params: Sequence[Tensor],
        doubles: Sequence[str] = (),
    ) -> None:
        self.keys = tuple(keys)
        self.derive = derive
        self.names = tuple(neutral)
        self._index = {name: k for k, name in enumerate(self.names)}
        self.read = operator.itemgetter(*self.keys)  # one group's raw values
        self.last: list[Any] | None = None  # the raw values last copied: [(row, group) -> tuple of values]
        self.volatile = False  # a tensor hyperparameter may change in place: refreshed every step
        self.rows = params[0].shape[0]
        self.device = device = params[0].device
        dtype = factor_dtype(params)
        # parameters outside every group read group 0's factors; the update never touches them
        self._group_index = torch.tensor([0 if g is None else g for g in group_of], device=device)
        count = (len(self.names), len(params), self.rows)
        self.base = torch.zeros(count, dtype=dtype, device=device)  # every row's factors, as last copied
        self.table = torch.zeros(count, dtype=dtype, device=device)  # this step's (skipped rows neutral)
        self.neutral = torch.tensor(list(neutral.values()), dtype=dtype, device=device).view(-1, 1, 1)
        self._double_index = torch.tensor([self._index[name] for name in doubles], dtype=torch.long, device=device)
        self._doubles = {name: d for d, name in enumerate(doubles)}
        self.doubles = torch.zeros((len(doubles), *count[1:]), dtype=_host_dtype(device), device=device)
        self._shapes = [(-1, *([1] * (p.dim() - 1))) for p in params]  # a parameter's factor shape, [B, 1, ...]
        self._views = self.views_in(self.table, range(len(params)))
        self._host_values: list[list[tuple[float, ...]]] = []  # [row][group] -> factors, as last copied
        self._base_stored: tuple[int, int] | None = None  # the tables' versions when table was set to base

    def stored_base(self) -> None:
        """:attr:`table` was just set to :attr:`base` (no row neutral): :meth:`holds_base` until either is written."""
        self._base_stored = (self.base._version, self.table._version)

    def holds_base(self) -> bool:
        """Whether :attr:`table` still holds :attr:`base` as :meth:`stored_base` found it.

        By the tables' version counters: every in-place write bumps them (a refresh's copy, a step's store, compiled
        code's writes included).
        """
        return self._base_stored == (self.base._version, self.table._version)

    def views_in(self, table: Tensor, indices: Iterable[int]) -> dict[str, list[Tensor]]:
        """Each factor of the parameters ``indices`` as ``[B, 1, ...]`` views of ``table`` (this table's layout)."""
        indices = list(indices)
        return {name: [table[k, i].view(self._shapes[i]) for i in indices] for name, k in self._index.items()}

    def views(self, name: str) -> list[Tensor]:
        """Factor ``name`` for each parameter, as ``[B, 1, ...]`` views of this step's table (stable objects)."""
        return self._views[name]

    def index(self, name: str) -> int:
        """The position of factor ``name`` in the tables' first dimension."""
        return self._index[name]

    def base_row(self, name: str) -> Tensor:
        """Every row's ``[P, B]`` values of factor ``name`` as last copied (skips not applied)."""
        return self.base[self._index[name]]

    def double(self, name: str) -> Tensor:
        """Every row's ``[P, B]`` values of factor ``name`` in double precision (one of ``doubles``)."""
        return self.doubles[self._doubles[name]]

    def host_factors(self, group: int) -> list[tuple[float, ...]]:
        """Param group ``group``'s factors of every row as last copied, on the host (what an update plans from)."""
        return [groups[group] for groups in self._host_values]

    def refresh(self, param_groups: Sequence[Sequence[Mapping[str, Any]]]) -> bool:
        """Copy the factors to the device if a raw value changed since the last copy; returns whether one did.

        Args:
            param_groups: each row's optimizer's ``param_groups``.
        """
        read = self.read
        raw = [read(group) for groups in param_groups for group in groups]
        if raw == self.last and not self.volatile:
            return False
        self.last = raw
        single = len(self.keys) == 1
        rows: list[list[tuple[float, ...]]] = []
        volatile = False
        for groups in param_groups:
            row = []
            for group in groups:
                values = (read(group),) if single else read(group)
                volatile = volatile or any(_holds_tensor(v) for v in values)
                row.append(tuple(self.derive(*(_number(v) for v in values))))
            rows.append(row)
        self.volatile = volatile
        self._host_values = rows
        # [B, G, K] in doubles on the host (pinned on CUDA), one transfer that does not wait, then each parameter
        # takes its group's values on the device
        host = torch.tensor(rows, dtype=self.doubles.dtype, pin_memory=self.device.type == "cuda")
        by_group = host.to(self.device, non_blocking=True).permute(2, 1, 0)
        by_param = torch.index_select(by_group, 1, self._group_index)
        self.base.copy_(by_param)
        if len(self._doubles):
            torch.index_select(by_param, 0, self._double_index, out=self.doubles)
        return True
