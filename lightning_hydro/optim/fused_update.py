"""The fused fast path: one vectorised SGD / Adam / AdamW update for all B trials of a group.

The universal path steps each trial's own optimizer (B optimizer calls of many small kernels each). When
every trial uses the same one of SGD, Adam or AdamW over all of its parameters in one group, the update can
instead run once on the stacked ``[B, ...]`` tensors with each hyperparameter as a ``[B]`` tensor broadcast
as ``[B, 1, ...]`` (torch.optim itself rejects a non-scalar tensor lr). The per-trial hyperparameters are
read every step from the trials' own optimizers' ``param_groups``, so LR schedulers keep working.

The arithmetic follows torch's single-tensor implementations operation by operation, so results agree
with the universal path to float rounding (tested). State is kept stacked and converted to and from
torch's per-trial format for checkpoints (:meth:`FusedUpdate.export_row` / :meth:`FusedUpdate.import_row`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import SGD, Adam, AdamW, Optimizer
from typing_extensions import override

__all__ = ["FusedAdamUpdate", "FusedSGDUpdate", "FusedUpdate", "SkipRows", "select_fused_update"]

# rows not to update: row indices known on the host, or a [B] bool mask on the device (no host sync)
SkipRows = Sequence[int] | Tensor


class _RowTensors:
    """``[B, 1, ...]`` tensors of per-row scalars, cached: hyperparameters rarely change between steps."""

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], Tensor] = {}

    def __call__(self, values: Sequence[Any], like: Tensor) -> Tensor:
        key = (tuple(values), like.dtype, like.device, like.dim())
        found = self._cache.get(key)
        if found is None:
            if len(self._cache) > 512:  # e.g. a scheduler changing lr every step: keep the cache small
                self._cache.clear()
            found = torch.tensor([float(v) for v in values], dtype=like.dtype, device=like.device)
            found = self._cache[key] = found.view(-1, *([1] * (like.dim() - 1)))
        return found


class FusedUpdate(ABC):
    """Vectorised optimizer update over stacked parameters; one state tensor ``[B, ...]`` per parameter.

    Args:
        params: the stacked parameters, in the order of each trial's optimizer param group.
    """

    def __init__(self, params: Sequence[nn.Parameter], group_of: Sequence[int | None] | None = None) -> None:
        self.params = list(params)
        self.state: list[dict[str, Any]] = [{} for _ in self.params]
        # the index of the param group each parameter is in (the same in every trial); None: not optimized
        self.group_of: list[int | None] = [0] * len(self.params) if group_of is None else list(group_of)
        self._rows = _RowTensors()

    def _by_group(self, param_groups: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, list[Any]]]:
        """Hyperparameters per group index, each a list over rows: ``[g][key][row]``."""
        return [
            {key: [groups[g][key] for groups in param_groups] for key in param_groups[0][g] if key != "params"}
            for g in range(len(param_groups[0]))
        ]

    def _active(self) -> list[tuple[nn.Parameter, Tensor, dict[str, Any], int]]:
        """(parameter, its gradient, its state, its group) for each parameter this step updates."""
        return [
            (p, p.grad, state, g)
            for p, state, g in zip(self.params, self.state, self.group_of)
            if g is not None and p.grad is not None
        ]

    @property
    def rows(self) -> int:
        """Number of trials (rows of the stacked tensors)."""
        return self.params[0].shape[0]

    @abstractmethod
    def step(self, param_groups: Sequence[Sequence[dict[str, Any]]], skip_rows: SkipRows = ()) -> None:
        """Update all rows from ``param.grad``; ``param_groups[r]`` are row r's optimizer's param groups.

        Rows in ``skip_rows`` (diverged trials: indices, or a ``[B]`` bool mask) are left as they were, their
        parameters exactly (see :meth:`_save_rows` for the state under a mask).
        """

    @abstractmethod
    def export_row(self, row: int) -> list[dict[str, Tensor]]:
        """Row ``row``'s state in torch's per-parameter format (empty dict: no state yet)."""

    @abstractmethod
    def import_row(self, row: int, states: Sequence[dict[str, Any]]) -> None:
        """Load row ``row``'s state from torch's per-parameter format."""

    def _save_rows(self, skip_rows: SkipRows) -> list[tuple[int, str | None, Tensor]]:
        """Copies of the skipped rows of every parameter and state tensor, to restore after the update.

        With a ``[B]`` bool mask (the fused module's steady state: which rows to skip is not known on the
        host) every row is copied and :meth:`_restore_rows` selects with ``torch.where``; with row indices only
        those rows are copied. The per-row ``step`` counts of Adam live on the CPU and are not restored under a
        mask (reading the mask there would be a device sync): a skipped row is a diverged trial, which leaves
        the group at the next read-back, so its optimizer state is never used again.
        """
        if isinstance(skip_rows, Tensor):
            saved: list[tuple[int, str | None, Tensor]] = [
                (i, None, p.detach().clone()) for i, p in enumerate(self.params)
            ]
            for i, state in enumerate(self.state):
                saved += [
                    (i, key, v.clone())
                    for key, v in state.items()
                    if isinstance(v, Tensor) and v.device == skip_rows.device
                ]
            return saved
        if not skip_rows:
            return []
        index = list(skip_rows)
        saved = [(i, None, p.data[index].clone()) for i, p in enumerate(self.params)]
        for i, state in enumerate(self.state):
            saved += [(i, key, v[index].clone()) for key, v in state.items() if isinstance(v, Tensor)]
        return saved

    def _restore_rows(self, saved: list[tuple[int, str | None, Tensor]], skip_rows: SkipRows) -> None:
        """Put the skipped rows back; state created during this step starts from zero in those rows."""
        if isinstance(skip_rows, Tensor):
            self._restore_masked(saved, skip_rows)
            return
        if not skip_rows:
            return
        index = list(skip_rows)
        restored: set[tuple[int, str]] = set()
        with torch.no_grad():
            for i, key, rows in saved:
                if key is None:
                    self.params[i].data[index] = rows
                else:
                    self.state[i][key][index] = rows
                    restored.add((i, key))
            for i, state in enumerate(self.state):
                for key, value in state.items():
                    if isinstance(value, Tensor) and (i, key) not in restored:
                        value[index] = 0

    def _restore_masked(self, saved: list[tuple[int, str | None, Tensor]], mask: Tensor) -> None:
        """``torch.where`` over all rows: a skipped row gets its saved values (never this step's non-finite ones).

        The other rows are selected unchanged, so they are bitwise what the update computed.
        """
        restored: set[tuple[int, str]] = set()
        with torch.no_grad():
            for i, key, before in saved:
                current = self.params[i].data if key is None else self.state[i][key]
                current.copy_(torch.where(_row_mask(mask, current), before, current))
                if key is not None:
                    restored.add((i, key))
            for i, state in enumerate(self.state):
                for key, value in state.items():
                    if isinstance(value, Tensor) and value.device == mask.device and (i, key) not in restored:
                        value.masked_fill_(_row_mask(mask, value), 0)


def _row_mask(mask: Tensor, like: Tensor) -> Tensor:
    """A ``[B]`` bool mask shaped to broadcast over ``like``'s rows."""
    return mask.view(-1, *([1] * (like.dim() - 1)))


class FusedSGDUpdate(FusedUpdate):
    """The update of ``torch.optim.SGD`` (momentum, dampening, nesterov, weight decay) for all rows at once.

    Not a ``torch.optim.Optimizer``: the group optimizer calls it in place of B trials' SGD optimizers.
    """

    @override
    @torch.no_grad()
    def step(self, param_groups: Sequence[Sequence[dict[str, Any]]], skip_rows: SkipRows = ()) -> None:
        skip = set() if isinstance(skip_rows, Tensor) else set(skip_rows)
        saved = self._save_rows(skip_rows)
        hyper = self._by_group(param_groups)
        active = self._active()
        steady = [a for a in active if self._is_steady(a[2], hyper[a[3]])]
        for g in {a[3] for a in steady}:
            self._steady_step([a for a in steady if a[3] == g], hyper[g])
        done = {id(a[2]) for a in steady}
        for param, d_p, state, g in active:
            if id(state) in done:
                continue
            lr, momentum, dampening = hyper[g]["lr"], hyper[g]["momentum"], hyper[g]["dampening"]
            weight_decay, nesterov = hyper[g]["weight_decay"], hyper[g]["nesterov"]
            uses_momentum = [float(m) != 0 for m in momentum]
            if any(weight_decay):
                d_p = d_p + self._rows(weight_decay, param) * param
            if any(uses_momentum):
                buf = state.get("momentum_buffer")
                initialized: list[bool] = state.get("initialized", [False] * self.rows)
                if buf is not None and all(uses_momentum) and all(initialized) and len(set(nesterov)) == 1:
                    # every row has a buffer (nesterov; the plain case runs in _steady_step): torch's update
                    buf.mul_(self._rows(momentum, param)).add_(
                        self._rows([1 - float(d) for d in dampening], param) * d_p
                    )
                    d_p = d_p + self._rows(momentum, param) * buf if nesterov[0] else buf
                else:
                    d_p = self._first_momentum_step(param, d_p, state, momentum, dampening, nesterov, skip)
            param.add_(self._rows([-float(x) for x in lr], param) * d_p)
        self._restore_rows(saved, skip_rows)

    def _is_steady(self, state: dict[str, Any], hyper: dict[str, list[Any]]) -> bool:
        """Every row has a momentum buffer, and no row uses nesterov: one update over all parameters at once."""
        return (
            state.get("momentum_buffer") is not None
            and all(state.get("initialized", [False]))
            and all(float(m) != 0 for m in hyper["momentum"])
            and not any(hyper["nesterov"])
        )

    def _steady_step(
        self, active: list[tuple[nn.Parameter, Tensor, dict[str, Any], int]], hyper: dict[str, Any]
    ) -> None:
        """The in-place momentum update of torch's SGD for the parameters of one group, as a few foreach calls.

        A loop over parameters costs several small kernel launches and Python row-tensor lookups each; on
        a small model that overhead is comparable to the arithmetic, so it is batched here (same numbers).
        ``torch._foreach_*`` has no public counterpart; torch.optim's own foreach implementations use it.
        """
        params: list[Tensor] = [a[0] for a in active]
        d_p: Sequence[Tensor] = [a[1] for a in active]
        bufs = [a[2]["momentum_buffer"] for a in active]
        if any(hyper["weight_decay"]):
            d_p = torch._foreach_addcmul(list(d_p), [self._rows(hyper["weight_decay"], p) for p in params], params)
        torch._foreach_mul_(bufs, [self._rows(hyper["momentum"], p) for p in params])
        if any(hyper["dampening"]):
            factors = [self._rows([1 - float(d) for d in hyper["dampening"]], p) for p in params]
            d_p = torch._foreach_mul(list(d_p), factors)
        torch._foreach_add_(bufs, list(d_p))
        torch._foreach_addcmul_(params, [self._rows([-float(x) for x in hyper["lr"]], p) for p in params], bufs)

    def _first_momentum_step(
        self,
        param: Tensor,
        d_p: Tensor,
        state: dict[str, Any],
        momentum: Sequence[Any],
        dampening: Sequence[Any],
        nesterov: Sequence[Any],
        skip: set[int],
    ) -> Tensor:
        """Rows without a buffer yet (or without momentum) mixed with rows that have one: torch's rules per row."""
        uses_momentum = [float(m) != 0 for m in momentum]
        initialized: list[bool] = state.get("initialized", [False] * self.rows)
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = torch.zeros_like(param)
        updated = buf * self._rows(momentum, param) + self._rows([1 - float(d) for d in dampening], param) * d_p
        # torch starts the buffer as a copy of the first gradient (no dampening on step one)
        new_buf = torch.where(self._rows(initialized, param).bool(), updated, d_p)
        active = self._rows(uses_momentum, param).bool()
        buf = torch.where(active, new_buf, buf)
        state["momentum_buffer"] = buf
        state["initialized"] = [
            done or (uses and row not in skip) for row, (done, uses) in enumerate(zip(initialized, uses_momentum))
        ]
        direction = torch.where(self._rows(nesterov, param).bool(), d_p + self._rows(momentum, param) * buf, buf)
        return torch.where(active, direction, d_p)

    @override
    def export_row(self, row: int) -> list[dict[str, Tensor]]:
        out: list[dict[str, Tensor]] = []
        for state in self.state:
            if state.get("initialized", [False] * self.rows)[row]:
                out.append({"momentum_buffer": state["momentum_buffer"][row].clone()})
            else:
                out.append({})
        return out

    @override
    @torch.no_grad()
    def import_row(self, row: int, states: Sequence[dict[str, Any]]) -> None:
        for param, state, incoming in zip(self.params, self.state, states):
            buf = incoming.get("momentum_buffer")
            initialized = state.setdefault("initialized", [False] * self.rows)
            if buf is None:
                initialized[row] = False
                continue
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(param)
            state["momentum_buffer"][row] = buf.to(param.device, param.dtype)
            initialized[row] = True


class FusedAdamUpdate(FusedUpdate):
    """The update of ``torch.optim.Adam`` / ``AdamW`` (L2 or decoupled weight decay, amsgrad) for all rows at once.

    Not a ``torch.optim.Optimizer``: the group optimizer calls it in place of B trials' Adam or AdamW optimizers.
    """

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        group_of: Sequence[int | None] | None = None,
        *,
        amsgrad: bool = False,
        decoupled: bool = False,
    ) -> None:
        super().__init__(params, group_of)
        self.amsgrad = amsgrad
        self.decoupled = decoupled

    def _ensure_state(self, param: Tensor, state: dict[str, Any]) -> None:
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(param)
            state["exp_avg_sq"] = torch.zeros_like(param)
            if self.amsgrad:
                state["max_exp_avg_sq"] = torch.zeros_like(param)
            # torch keeps `step` as a float32 scalar on the CPU per parameter; here one per row
            state["step"] = torch.zeros(param.shape[0], dtype=torch.float32)

    @override
    @torch.no_grad()
    def step(self, param_groups: Sequence[Sequence[dict[str, Any]]], skip_rows: SkipRows = ()) -> None:
        saved = self._save_rows(skip_rows)
        hyper = self._by_group(param_groups)
        per_group = [  # (lr, beta1, beta2) per group, each a list over rows: read once per step, not per parameter
            (
                [float(x) for x in h["lr"]],
                [float(b[0]) for b in h["betas"]],
                [float(b[1]) for b in h["betas"]],
            )
            for h in hyper
        ]
        for param, grad, state, g in self._active():
            (lr, beta1, beta2), eps, weight_decay = per_group[g], hyper[g]["eps"], hyper[g]["weight_decay"]
            self._ensure_state(param, state)
            state["step"] += 1
            steps = state["step"].tolist()
            if any(weight_decay):
                if self.decoupled:
                    param.mul_(self._rows([1 - a * float(w) for a, w in zip(lr, weight_decay)], param))
                else:
                    grad = grad + self._rows(weight_decay, param) * param
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(grad, self._rows([1 - b for b in beta1], param))
            exp_avg_sq.mul_(self._rows(beta2, param)).add_(self._rows([1 - b for b in beta2], param) * grad * grad)
            step_size = [a / (1 - b**s) for a, b, s in zip(lr, beta1, steps)]
            bias_correction2_sqrt = [(1 - b**s) ** 0.5 for b, s in zip(beta2, steps)]
            second_moment = exp_avg_sq
            if self.amsgrad:
                torch.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
                second_moment = state["max_exp_avg_sq"]
            denom = (second_moment.sqrt() / self._rows(bias_correction2_sqrt, param)).add_(self._rows(eps, param))
            param.add_((self._rows([-s for s in step_size], param) * exp_avg) / denom)
        self._restore_rows(saved, skip_rows)

    @override
    def export_row(self, row: int) -> list[dict[str, Tensor]]:
        out: list[dict[str, Tensor]] = []
        for state in self.state:
            if "step" not in state or state["step"][row] == 0:
                out.append({})
                continue
            entry = {
                "step": state["step"][row].clone(),
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
        for param, state, incoming in zip(self.params, self.state, states):
            if not incoming:
                if "step" in state:
                    state["step"][row] = 0
                    for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                        if key in state:
                            state[key][row] = 0
                continue
            self._ensure_state(param, state)
            state["step"][row] = float(incoming["step"])
            state["exp_avg"][row] = incoming["exp_avg"].to(param.device, param.dtype)
            state["exp_avg_sq"][row] = incoming["exp_avg_sq"].to(param.device, param.dtype)
            if self.amsgrad:
                state["max_exp_avg_sq"][row] = incoming["max_exp_avg_sq"].to(param.device, param.dtype)


def _group_structure(opt: Optimizer, params: Sequence[nn.Parameter]) -> list[int | None] | str:
    """The group index of each parameter (None: in no group), or why the optimizer cannot be fused."""
    index = {id(p): i for i, p in enumerate(params)}
    group_of: list[int | None] = [None] * len(params)
    for g, group in enumerate(opt.param_groups):
        for p in group["params"]:
            if id(p) not in index:
                return "an optimizer holds parameters outside the trial"
            group_of[index[id(p)]] = g
        if group.get("maximize") or group.get("differentiable"):
            return "maximize=True or differentiable=True"
    return group_of


def select_fused_update(
    optimizers: Sequence[Optimizer], trial_params: Sequence[Sequence[nn.Parameter]], stacked: Sequence[nn.Parameter]
) -> FusedUpdate | str:
    """A fused update for these trial optimizers, or the reason why they need the universal path.

    The trials' optimizers must be of one class (SGD, Adam or AdamW) and group the parameters the same
    way (e.g. the per-multiplier groups of muP surrogates); hyperparameters may differ per trial and group.

    Args:
        optimizers: each trial's optimizer, in row order.
        trial_params: each trial's parameters in the order of the stacked parameters.
        stacked: the stacked parameters.
    """
    kinds = {type(opt) for opt in optimizers}
    if len(kinds) != 1:
        return f"the trials use different optimizer classes ({', '.join(sorted(k.__name__ for k in kinds))})"
    kind = kinds.pop()
    if kind not in (SGD, Adam, AdamW):
        return f"{kind.__name__} has no fused implementation (SGD, Adam and AdamW do)"
    structures = []
    for opt, params in zip(optimizers, trial_params):
        if any(p.is_complex() for p in params):
            return "complex parameters"
        structure = _group_structure(opt, params)
        if isinstance(structure, str):
            return structure
        structures.append(structure)
    if any(s != structures[0] for s in structures[1:]):
        return "the trials' optimizers group their parameters differently"
    if kind is SGD:
        return FusedSGDUpdate(stacked, structures[0])
    groups = [g for opt in optimizers for g in opt.param_groups]
    amsgrad = {bool(g["amsgrad"]) for g in groups}
    decoupled = {bool(g.get("decoupled_weight_decay", kind is AdamW)) for g in groups}
    if len(amsgrad) != 1 or len(decoupled) != 1:
        return "the trials differ in amsgrad or decoupled weight decay"
    return FusedAdamUpdate(stacked, structures[0], amsgrad=amsgrad.pop(), decoupled=decoupled.pop())
