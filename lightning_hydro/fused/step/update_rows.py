"""A fused update's stacked state, and its exchange with torch's per-trial format (checkpoints, slot changes).

The fused update (:mod:`.fused_update`) keeps every row's optimizer state stacked, ``[B, ...]`` per parameter,
and the counters torch keeps on the host (Adam's ``step``, SGD's "has a momentum buffer") as ``[P, B]`` device
tensors. A row's state leaves in torch's own per-parameter format when its trial leaves the group or a checkpoint
is written (:meth:`~RowStates.export_row`: one read of the counters, however many rows are exported before the
next step), and comes in from it when a trial joins or a checkpoint is loaded (:meth:`~RowStates.import_row`).
None of this runs in the steady step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import override

__all__ = ["AdamRowStates", "RowStates", "SGDRowStates"]


class RowStates:
    """The stacked state of a fused update (a part of :class:`~lightning_hydro.fused.step.fused_update.FusedUpdate`)."""

    params: list[nn.Parameter]
    state: list[dict[str, Tensor]]  # stacked [B, ...] state tensors per parameter
    _host_rows: list[list[Any]] | None  # [P][B] counters read back for export, until the next step
    _plan_key: tuple[int, ...] | None  # the update's plan (None: make it again: a state tensor was created)

    def export_row(self, row: int) -> list[dict[str, Tensor]]:
        """Row ``row``'s state in torch's per-parameter format (empty dict: no state yet)."""
        raise NotImplementedError

    def import_row(self, row: int, states: Sequence[dict[str, Any]]) -> None:
        """Load row ``row``'s state from torch's per-parameter format."""
        raise NotImplementedError

    def state_of(self, i: int, key: str) -> Tensor:
        """Parameter ``i``'s stacked state tensor ``key`` (zeros, made on first use)."""
        found = self.state[i].get(key)
        if found is None:
            found = self.state[i][key] = torch.zeros_like(self.params[i], memory_format=torch.preserve_format)
        return found

    def _read_counters(self, counters: Tensor) -> list[list[Any]]:
        """``[P][B]`` values of a device counter, read once per export (one sync) until the next step."""
        if self._host_rows is None:
            self._host_rows = counters.tolist()
        return self._host_rows

    def state_tensors(self) -> list[Tensor]:
        """Every state tensor the update holds (for memory accounting)."""
        return [v for state in self.state for v in state.values()]


class SGDRowStates(RowStates):
    """SGD's momentum buffers, and which (parameter, row) has one."""

    initialized: Tensor  # [P, B] bool
    _fresh: set[int]  # parameters some row of which may start a buffer at the next step

    def _has_buffer(self, row: int) -> list[bool]:
        flags = self._read_counters(self.initialized)
        return [bool(flags[i][row]) for i in range(len(self.params))]

    @override
    def export_row(self, row: int) -> list[dict[str, Tensor]]:
        has = self._has_buffer(row)
        return [
            {"momentum_buffer": state["momentum_buffer"][row].clone()} if has[i] and "momentum_buffer" in state else {}
            for i, state in enumerate(self.state)
        ]

    @override
    @torch.no_grad()
    def import_row(self, row: int, states: Sequence[dict[str, Any]]) -> None:
        self._host_rows = None
        for i, (param, incoming) in enumerate(zip(self.params, states)):
            buf = incoming.get("momentum_buffer")
            self.initialized[i, row] = buf is not None
            if buf is None:
                self._fresh.add(i)
                continue
            self.state_of(i, "momentum_buffer")[row] = buf.to(param.device, param.dtype)
            self._plan_key = None


class AdamRowStates(RowStates):
    """Adam's moments and per-(parameter, row) step counts."""

    steps: Tensor  # [P, B]
    amsgrad: bool

    @override
    def export_row(self, row: int) -> list[dict[str, Tensor]]:
        steps = self._read_counters(self.steps)
        out: list[dict[str, Tensor]] = []
        for i, state in enumerate(self.state):
            if steps[i][row] == 0 or "exp_avg" not in state:
                out.append({})
                continue
            entry = {
                # torch keeps `step` as a float32 scalar on the CPU (its non-capturable default)
                "step": torch.tensor(float(steps[i][row]), dtype=torch.float32),
                "exp_avg": state["exp_avg"][row].clone(),
                "exp_avg_sq": state["exp_avg_sq"][row].clone(),
            }
            if self.amsgrad:
                entry["max_exp_avg_sq"] = state["max_exp_avg_sq"][row].clone()
            out.append(entry)
        return out

    @override
    @torch.no_grad()
    def import_row(self, row: int, states: Sequence[dict[str, Any]]) -> None:
        self._host_rows = None
        for i, (param, incoming) in enumerate(zip(self.params, states)):
            if not incoming:
                self.steps[i, row] = 0
                for value in self.state[i].values():
                    value[row] = 0
                continue
            self.steps[i, row] = float(incoming["step"])
            for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if self.amsgrad else ("exp_avg", "exp_avg_sq"):
                self.state_of(i, key)[row] = incoming[key].to(param.device, param.dtype)
            self._plan_key = None
