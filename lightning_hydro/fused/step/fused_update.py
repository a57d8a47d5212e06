"""The fused update: one vectorised SGD / Adam / AdamW step for all B trials of a group.

The universal path steps each trial's own optimizer (B optimizer calls, many small kernels each). When every
trial uses the same one of SGD, Adam or AdamW and groups its parameters the same way, the update runs once on
the stacked ``[B, ...]`` tensors: a handful of ``torch._foreach_*`` calls over the group's parameters, each
hyperparameter a ``[B, 1, ...]`` factor (:mod:`.row_hyperparameters`; torch.optim itself rejects a non-scalar
tensor ``lr``). No Python loop over rows, no value read back to the host, no host-to-device copy unless a
hyperparameter changed.

Rows to skip (diverged trials) come as a ``[B]`` bool mask on the device. They are skipped without knowing
which they are on the host: their non-finite gradients are zeroed and their factors replaced by neutral ones
(a multiplier 1, an added term 0), so their parameters and state stay exactly as they were, and every other
row is computed bitwise as without the mask.

The arithmetic follows torch's single-tensor implementations operation by operation (scalars computed in
double precision, as torch computes them on the host), so rows agree with the universal path to float rounding
(tested). Per-row counters that torch keeps on the host (Adam's ``step``, SGD's "has a momentum buffer") live
on the device as ``[P, B]`` tensors, read only when the state is exported to torch's per-trial format for
checkpoints and slot changes (:meth:`FusedUpdate.export_row` / :meth:`FusedUpdate.import_row`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import SGD, Adam, AdamW, Optimizer
from typing_extensions import override

from lightning_hydro.fused.step.compiled_update import run_device_step
from lightning_hydro.fused.step.row_hyperparameters import RowHyperparameters

__all__ = ["FusedAdamUpdate", "FusedSGDUpdate", "FusedUpdate", "SkipRows", "select_fused_update"]

# rows not to update: row indices known on the host, or a [B] bool mask on the device (no host sync)
SkipRows = Sequence[int] | Tensor


@dataclass
class _Part:
    """Parameters updated by the same sequence of foreach calls (one kind of group, with or without decay)."""

    indices: list[int]
    kind: str
    decay: bool
    params: list[Tensor] = field(default_factory=list)
    views: dict[str, list[Tensor]] = field(default_factory=dict)
    states: dict[str, list[Tensor]] = field(default_factory=dict)


class FusedUpdate(ABC):
    """Vectorised optimizer update over stacked parameters; one state tensor ``[B, ...]`` per parameter.

    Args:
        params: the stacked parameters, in the order of each trial's optimizer param groups.
        group_of: the index of the param group each parameter is in (the same in every trial); None: not
            optimized. Default: every parameter in group 0.
    """

    #: the raw ``param_groups`` keys the update reads
    KEYS: tuple[str, ...] = ()
    #: the per-row factors and the value of each that leaves a skipped row as it is
    NEUTRAL: dict[str, float] = {}
    #: factors the update also needs in double precision (for its arithmetic on the device)
    DOUBLES: tuple[str, ...] = ()

    def __init__(self, params: Sequence[nn.Parameter], group_of: Sequence[int | None] | None = None) -> None:
        self.params = list(params)
        self.state: list[dict[str, Tensor]] = [{} for _ in self.params]  # stacked [B, ...] state per parameter
        self.group_of: list[int | None] = [0] * len(self.params) if group_of is None else list(group_of)
        self._optimized = [i for i, g in enumerate(self.group_of) if g is not None]
        self._factors: RowHyperparameters | None = None
        self._plan: list[_Part] = []
        self._plan_key: tuple[int, ...] | None = None
        self._indices: dict[tuple[int, ...], Tensor] = {}  # device index of the active parameters, by set
        self._host_rows: list[list[Any]] | None = None  # [P][B] counters read back for export, until the next step
        self._compiled: bool | str = False  # run the device work under torch.compile (True, "reduce-overhead")

    @property
    def rows(self) -> int:
        """Number of trials (rows of the stacked tensors)."""
        return self.params[0].shape[0]

    @property
    def device(self) -> torch.device:
        """The device of the stacked parameters."""
        return self.params[0].device

    @abstractmethod
    def derive(self, *values: Any) -> tuple[float, ...]:
        """One param group's factors (in :attr:`NEUTRAL` order) from its raw values (in :attr:`KEYS` order)."""

    @abstractmethod
    def export_row(self, row: int) -> list[dict[str, Tensor]]:
        """Row ``row``'s state in torch's per-parameter format (empty dict: no state yet)."""

    @abstractmethod
    def import_row(self, row: int, states: Sequence[dict[str, Any]]) -> None:
        """Load row ``row``'s state from torch's per-parameter format."""

    @abstractmethod
    def _kind(self, values: Sequence[Sequence[Any]], group: int) -> str:
        """How the parameters of ``group`` are updated, from its factors on the host (``values[row]``)."""

    @abstractmethod
    def _run(self, part: _Part, grads: list[Tensor] | tuple[Tensor, ...]) -> None:
        """The foreach calls of one part of the plan, with this step's factors."""

    def _prepare(self, active: list[int]) -> Any:
        """Host-side facts the device work of a step needs (e.g. which counters it touches); no device work."""
        return self._counters(active)

    def _before(self, skip: Tensor | None, prepared: Any) -> None:  # noqa: B027 - optional hook
        """Per-step device work on the ``[P, B]`` counters before the foreach calls (e.g. Adam's bias corrections)."""

    def _finish(self, active: list[int], prepared: Any) -> None:  # noqa: B027 - optional hook
        """Host-side bookkeeping after a step."""

    def _state_keys(self, kind: str) -> tuple[str, ...]:
        """The per-parameter state tensors a part of ``kind`` needs (created as zeros on first use)."""
        return ()

    def compile(self, setting: bool | str) -> None:
        """Run the device work of each step under ``torch.compile`` (see :mod:`.compiled_update`); False: eagerly."""
        self._compiled = setting

    @torch.no_grad()
    def step(self, param_groups: Sequence[Sequence[dict[str, Any]]], skip_rows: SkipRows = ()) -> None:
        """Update all rows from ``param.grad``; ``param_groups[r]`` are row r's optimizer's param groups.

        Rows in ``skip_rows`` (diverged trials: indices, or a ``[B]`` bool mask) are left as they were, their
        parameters and state exactly; their gradients are zeroed where not finite.
        """
        skip = self._mask(skip_rows)
        active, grads = self._gradients()
        if not active:
            return
        factors = self._factors_for(param_groups)
        plan = self._plan_for(active, factors)
        self._host_rows = None
        prepared = self._prepare(active)
        if len(plan) == 1:
            by_part = [grads]
        else:
            by_index = dict(zip(active, grads))
            by_part = [[by_index[i] for i in part.indices] for part in plan]
        if self._compiled:
            run_device_step(self, by_part, skip, prepared, self._compiled)
        else:
            self.device_step(by_part, skip, prepared)  # what run_device_step does eagerly, without the hop
        self._finish(active, prepared)

    def device_step(self, grads: list[list[Tensor]], skip: Tensor | None, prepared: Any) -> None:
        """A step's device work, pure tensor code (what ``compile`` compiles): the plan's parts' gradients in."""
        if skip is not None:  # a NaN times a neutral factor is still NaN: zero the skipped rows' gradients
            for part_grads in grads:
                for grad in part_grads:
                    grad.masked_fill_(skip.view(-1, *([1] * (grad.dim() - 1))), 0)
        factors = self._factors
        assert factors is not None
        factors.select(skip)
        self._before(skip, prepared)
        for part, part_grads in zip(self._plan, grads):
            self._run(part, part_grads)

    def _mask(self, skip_rows: SkipRows) -> Tensor | None:
        if isinstance(skip_rows, Tensor):
            return skip_rows
        if not skip_rows:
            return None
        mask = torch.zeros(self.rows, dtype=torch.bool, device=self.device)
        mask[list(skip_rows)] = True
        return mask

    def _gradients(self) -> tuple[list[int], list[Tensor]]:
        """The parameters this step updates (optimized, with a gradient) and their gradients."""
        params = self.params
        grads = [params[i].grad for i in self._optimized]
        if all(g is not None for g in grads):
            return self._optimized, grads  # type: ignore[return-value]
        active = [i for i, g in zip(self._optimized, grads) if g is not None]
        return active, [params[i].grad for i in active]  # type: ignore[misc]

    def _factors_for(self, param_groups: Sequence[Sequence[dict[str, Any]]]) -> RowHyperparameters:
        factors = self._factors
        if factors is None or factors.base.device != self.device or factors.rows != self.rows:
            factors = self._factors = RowHyperparameters(
                self.KEYS, self.derive, self.NEUTRAL, group_of=self.group_of, params=self.params, doubles=self.DOUBLES
            )
            self._plan_key = None
        if factors.refresh(param_groups):
            self._plan_key = None  # the kinds of update may have changed
        return factors

    def _plan_for(self, active: list[int], factors: RowHyperparameters) -> list[_Part]:
        key = tuple(active)
        if key == self._plan_key:
            return self._plan
        kinds = {}
        decays = {}
        for g in {self.group_of[i] for i in active}:
            assert g is not None
            values = factors.host_factors(g)
            kinds[g] = self._kind(values, g)
            decays[g] = self._decays(values)
        parts: dict[tuple[str, bool], _Part] = {}
        for i in active:
            g = self.group_of[i]
            assert g is not None
            part = parts.setdefault((kinds[g], decays[g]), _Part([], kinds[g], decays[g]))
            part.indices.append(i)
        for part in parts.values():
            part.params = [self.params[i] for i in part.indices]
            part.views = {name: [factors.views(name)[i] for i in part.indices] for name in self.NEUTRAL}
            for key_name in self._state_keys(part.kind):
                part.states[key_name] = [self._state(i, key_name) for i in part.indices]
        self._plan, self._plan_key = list(parts.values()), key
        return self._plan

    def _decays(self, values: Sequence[Sequence[Any]]) -> bool:
        """Whether any row of a group has weight decay (else its foreach call is left out)."""
        k = list(self.NEUTRAL).index("weight_decay")
        return any(row[k] != 0 for row in values)

    def _state(self, i: int, key: str) -> Tensor:
        found = self.state[i].get(key)
        if found is None:
            found = self.state[i][key] = torch.zeros_like(self.params[i], memory_format=torch.preserve_format)
        return found

    def _counters(self, active: list[int]) -> Tensor | None:
        """Index of the active parameters' rows of a ``[P, B]`` counter (None: every parameter is active).

        Made once per set of active parameters (a parameter outside every group, or one without a gradient).
        """
        if len(active) == len(self.params):
            return None
        key = tuple(active)
        found = self._indices.get(key)
        if found is None or found.device != self.device:
            found = self._indices[key] = torch.tensor(active, device=self.device)
        return found

    def _read_counters(self, counters: Tensor) -> list[list[Any]]:
        """``[P][B]`` values of a device counter, read once per export (one sync) until the next step."""
        if self._host_rows is None:
            self._host_rows = counters.tolist()
        return self._host_rows

    def state_tensors(self) -> list[Tensor]:
        """Every state tensor the update holds (for memory accounting)."""
        return [v for state in self.state for v in state.values()]


class FusedSGDUpdate(FusedUpdate):
    """The update of ``torch.optim.SGD`` (momentum, dampening, nesterov, weight decay) for all rows at once.

    Not a ``torch.optim.Optimizer``: the group optimizer calls it in place of B trials' SGD optimizers.
    """

    KEYS = ("lr", "momentum", "dampening", "weight_decay", "nesterov")
    NEUTRAL = {
        "weight_decay": 0.0,
        "keep": 1.0,  # the momentum buffer's multiplier (torch: buf.mul_(momentum))
        "add": 0.0,  # the gradient's weight into the buffer (torch: add_(grad, alpha=1 - dampening))
        "neg_lr": 0.0,
        "from_grad": 0.0,  # direction = from_grad * grad + from_buffer * buffer (only where rows differ in kind)
        "from_buffer": 0.0,
        "uses_momentum": 0.0,  # 1 where the row uses momentum (has a buffer)
    }

    def __init__(self, params: Sequence[nn.Parameter], group_of: Sequence[int | None] | None = None) -> None:
        super().__init__(params, group_of)
        # which (parameter, row) has a momentum buffer, as torch's state says; no parameter has one yet
        self.initialized = torch.zeros(len(self.params), self.rows, dtype=torch.bool, device=self.device)
        self._fresh = set(range(len(self.params)))  # parameters some row of which may start a buffer this step

    @override
    def derive(self, lr: float, momentum: float, dampening: float, weight_decay: float, nesterov: bool) -> tuple:
        uses = momentum != 0
        return (
            weight_decay,
            momentum,
            1 - dampening if uses else 0.0,
            -lr,
            1.0 if (nesterov or not uses) else 0.0,
            (momentum if nesterov else 1.0) if uses else 0.0,
            1.0 if uses else 0.0,
        )

    @override
    def _kind(self, values: Sequence[Sequence[Any]], group: int) -> str:
        uses = [row[6] != 0 for row in values]
        if not any(uses):
            return "plain"  # no row has momentum: the gradient is the direction
        if all(uses) and all(row[4] == 0 for row in values):
            return "momentum"  # every row: direction = buffer
        return "mixed"

    @override
    def _state_keys(self, kind: str) -> tuple[str, ...]:
        return () if kind == "plain" else ("momentum_buffer",)

    @override
    def _prepare(self, active: list[int]) -> Any:
        # whether a row may start its buffer this step, and which parameters take the step
        return bool(self._fresh.intersection(active)), self._counters(active)

    @override
    def _before(self, skip: Tensor | None, prepared: Any) -> None:
        fresh, index = prepared
        if not fresh:
            return
        factors = self._factors
        assert factors is not None
        # a row's first step with momentum starts its buffer as a copy of the gradient (torch: no dampening)
        first = ~self.initialized & factors.base_row("uses_momentum").bool()
        if skip is not None:
            first &= ~skip
        if index is not None:  # a parameter without a gradient takes no step
            first &= torch.zeros_like(first).index_fill_(0, index, True)
        factors.row("keep").masked_fill_(first, 0.0)
        factors.row("add").masked_fill_(first, 1.0)
        self.initialized |= first

    @override
    def _finish(self, active: list[int], prepared: Any) -> None:
        if prepared[0]:
            self._fresh.difference_update(active)

    @override
    def _run(self, part: _Part, grads: list[Tensor] | tuple[Tensor, ...]) -> None:
        params, views = part.params, part.views
        if part.decay:
            grads = torch._foreach_addcmul(grads, views["weight_decay"], params)
        direction: list[Tensor] | tuple[Tensor, ...] = grads
        if part.kind != "plain":
            buffers = part.states["momentum_buffer"]
            torch._foreach_mul_(buffers, views["keep"])
            torch._foreach_addcmul_(buffers, views["add"], grads)
            if part.kind == "momentum":
                direction = buffers
            else:
                direction = torch._foreach_mul(grads, views["from_grad"])
                torch._foreach_addcmul_(direction, views["from_buffer"], buffers)
        torch._foreach_addcmul_(params, views["neg_lr"], direction)

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
            self._state(i, "momentum_buffer")[row] = buf.to(param.device, param.dtype)
            self._plan_key = None


class FusedAdamUpdate(FusedUpdate):
    """The update of ``torch.optim.Adam`` / ``AdamW`` (L2 or decoupled weight decay, amsgrad) for all rows at once.

    Not a ``torch.optim.Optimizer``: the group optimizer calls it in place of B trials' Adam or AdamW optimizers.
    Each (parameter, row) counts its steps on the device, as torch's ``capturable`` Adam does; the bias
    corrections are computed there in double precision each step (no host round trip).
    """

    KEYS = ("lr", "betas", "eps", "weight_decay")
    NEUTRAL = {
        "weight_decay": 0.0,  # L2: grad + weight_decay * param
        "decay": 1.0,  # decoupled: param * (1 - lr * weight_decay)
        "lerp": 0.0,  # exp_avg.lerp_(grad, 1 - beta1)
        "beta2": 1.0,
        "add_sq": 0.0,  # exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)
        "eps": 1.0,
        "neg_step": 0.0,  # -lr / bias_correction1, written each step
        "bias2_sqrt": 1.0,  # sqrt(bias_correction2), written each step
        "neg_lr": 0.0,
        "beta1": 0.0,
    }
    DOUBLES = ("neg_lr", "beta1", "beta2")  # beta1 and beta2 side by side: both bias corrections in one op

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
        host = torch.float32 if self.device.type == "mps" else torch.float64
        self.steps = torch.zeros(len(self.params), self.rows, dtype=host, device=self.device)
        names = list(self.NEUTRAL)
        self._corrections = slice(names.index("neg_step"), names.index("bias2_sqrt") + 1)
        self._neutral_corrections = torch.tensor([0.0, 1.0], dtype=host, device=self.device).view(2, 1, 1)

    @override
    def derive(self, lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> tuple:
        beta1, beta2 = float(betas[0]), float(betas[1])
        decoupled = self.decoupled
        return (
            0.0 if decoupled else weight_decay,
            1 - lr * weight_decay if decoupled else 1.0,
            1 - beta1,
            beta2,
            1 - beta2,
            eps,
            0.0,
            1.0,
            -lr,
            beta1,
        )

    @override
    def _kind(self, values: Sequence[Sequence[Any]], group: int) -> str:
        return "adam"

    @override
    def _decays(self, values: Sequence[Sequence[Any]]) -> bool:
        return any(row[0] != 0 or row[1] != 1 for row in values)

    @override
    def _state_keys(self, kind: str) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if self.amsgrad else ("exp_avg", "exp_avg_sq")

    @override
    def _before(self, skip: Tensor | None, prepared: Any) -> None:
        factors = self._factors
        assert factors is not None
        index = prepared
        if index is None:
            self.steps.add_(1 if skip is None else ~skip)
        else:  # a parameter without a gradient takes no step
            taken = torch.ones_like(self.steps[0]) if skip is None else (~skip).to(self.steps.dtype)
            self.steps.index_add_(0, index, taken.expand(index.shape[0], -1))
        # torch, in doubles on the host: step_size = lr / (1 - beta1 ** step), bias_correction2_sqrt =
        # sqrt(1 - beta2 ** step); here in doubles on the device, both corrections at once
        corrections = 1 - torch.pow(factors.doubles[1:], self.steps)
        corrections[0] = factors.double("neg_lr") / corrections[0]
        corrections[1].sqrt_()
        if skip is not None:  # a skipped row may be at step 0, where these are inf and 0: make it neutral
            torch.where(skip, self._neutral_corrections, corrections, out=corrections)
        factors.table[self._corrections].copy_(corrections)

    @override
    def _run(self, part: _Part, grads: list[Tensor] | tuple[Tensor, ...]) -> None:
        params, views, states = part.params, part.views, part.states
        if part.decay:
            if self.decoupled:
                torch._foreach_mul_(params, views["decay"])
            else:
                grads = torch._foreach_addcmul(grads, views["weight_decay"], params)
        exp_avgs, exp_avg_sqs = states["exp_avg"], states["exp_avg_sq"]
        torch._foreach_lerp_(exp_avgs, grads, views["lerp"])
        torch._foreach_mul_(exp_avg_sqs, views["beta2"])
        torch._foreach_addcmul_(exp_avg_sqs, torch._foreach_mul(grads, views["add_sq"]), grads)
        second = exp_avg_sqs
        if self.amsgrad:
            torch._foreach_maximum_(states["max_exp_avg_sq"], exp_avg_sqs)
            second = states["max_exp_avg_sq"]
        denom = torch._foreach_sqrt(second)
        torch._foreach_div_(denom, views["bias2_sqrt"])
        torch._foreach_add_(denom, views["eps"])
        update = torch._foreach_mul(exp_avgs, views["neg_step"])
        torch._foreach_div_(update, denom)
        torch._foreach_add_(params, update)

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
            for key in self._state_keys("adam"):
                self._state(i, key)[row] = incoming[key].to(param.device, param.dtype)
            self._plan_key = None


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
