"""One torch optimizer, as Lightning sees it, that steps every trial of a fused group with its own optimizer.

Lightning's automatic optimization drives one optimizer: it runs the closure (forward, backward,
gradient clipping), then calls ``step``. :class:`TrialGroupOptimizer` is that optimizer. After the closure
it checks each row for a non-finite loss (``skip``, given by the caller) or non-finite gradients (such a row
is not stepped), then updates the healthy rows either

- on the *universal* path: each trial parameter's ``.grad`` becomes the view ``stacked.grad[row]`` and the
  trial's own optimizer steps, whatever its class; or
- on the *fused* path: one vectorised SGD/Adam/AdamW update of the stacked tensors, by the group's
  :class:`FastPath` (:mod:`lightning_hydro.fused.step` builds it; this layer knows only its interface).

Its ``state_dict`` holds every trial's optimizer and scheduler state in torch's own per-trial format,
keyed by trial id, whichever path produced it.

The conversation is one-way: the fused module passes the rows to skip into :meth:`TrialGroupOptimizer.step`
and gets back a :class:`StepReport`; slot changes go through :meth:`TrialGroupOptimizer.add_trial` and
:meth:`TrialGroupOptimizer.remove_trial`. On the fused path nothing in ``step`` reads a value back to the host:
the skipped rows are a ``[B]`` mask on the device and the report holds device tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from typing_extensions import override

from lightning_hydro.optim.group_param_group import GroupParamGroup
from lightning_hydro.optim.optimizer_config import TrialOptimization

if TYPE_CHECKING:
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = [
    "FastPath",
    "FastPathBuilder",
    "NoRows",
    "OptimizerPath",
    "RowsToSkip",
    "StepReport",
    "TrialClipping",
    "TrialGroupOptimizer",
    "TrialScheduler",
    "clips_by_value",
    "row_sums",
]

OptimizerPath = Literal["auto", "universal", "fused"]


def row_sums(grads: Sequence[Tensor], *, concatenate: bool) -> Tensor:
    """``[B]``: each row's sum of the ``[B, ...]`` gradients, on the device; not finite where a row holds a NaN or inf.

    ``concatenate`` (small groups): one concatenation and one sum, which beat a reduction per parameter (launches,
    on a GPU). Summed in at least single precision: a float16 sum overflows at 65504, which finite gradients reach.
    """
    rows = [g.reshape(g.shape[0], -1) for g in grads]
    acc = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    if concatenate:
        return torch.cat(rows, 1).sum(1, dtype=acc)
    return torch.stack([r.sum(1, dtype=acc) for r in rows]).sum(0)


class NoRows:
    """An all-False ``[B]`` bool mask (a step that skips no row), made once per group size and device; never written.

    Example::

        >>> no_rows = NoRows()
        >>> no_rows(3, torch.device("cpu")).tolist(), no_rows(3, torch.device("cpu")) is no_rows(3, torch.device("cpu"))
        ([False, False, False], True)
    """

    def __init__(self) -> None:
        self._mask: Tensor | None = None

    def __call__(self, rows: int, device: torch.device) -> Tensor:
        """The mask for ``rows`` rows on ``device``."""
        mask = self._mask
        if mask is None or mask.shape[0] != rows or mask.device != device:
            mask = self._mask = torch.zeros(rows, dtype=torch.bool, device=device)
        return mask


class RowsToSkip(Protocol):
    """The rows ``step`` must leave untouched, read after the closure ran (the closure runs ``training_step``)."""

    def rows_to_skip(self, trial_ids: list[int]) -> Tensor | None:
        """A ``[B]`` bool mask over the rows of ``trial_ids`` (True: do not step), or None: skip none."""

    def reads_each_step(self, device: torch.device) -> bool:
        """Whether reading the step's masks back to the host costs no wait on ``device`` (then the update may)."""


class TrialClipping(Protocol):
    """Clips each trial's gradients with its own module's ``configure_gradient_clipping`` (Lightning's rule per trial).

    The group optimizer clips the rows itself in one pass on the fused path; it hands clipping to this where it
    cannot: on the universal path, or when a trial clips its own way (overrides the hook).
    """

    def overridden(self) -> bool:
        """Whether a running trial overrides ``configure_gradient_clipping`` (asked when the rows change)."""

    def clip(self, value: float | None, algorithm: Any) -> None:
        """Clip each running trial's gradients by its own hook, as Lightning would clip it alone."""


class FastPath(Protocol):
    """The fused fast path: one vectorised update of every row of the stacked parameters, on the device.

    Built by a :data:`FastPathBuilder` (``lightning_hydro.fused.step.select_update.select_fused_update``) for a
    group whose trials all use one of the optimizer classes it implements; it holds the optimizer state of every
    row, stacked.
    """

    def step(
        self,
        param_groups: Sequence[Sequence[dict[str, Any]]],
        skip_rows: Tensor | Sequence[int],
        *,
        read: bool = False,
        frozen: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Update every row except ``skip_rows``' and those with non-finite gradients.

        ``read``: reading the masks back to the host costs no wait (:meth:`RowsToSkip.reads_each_step`).
        ``frozen``: ``[P, B]`` bool, True where row b's trial has frozen parameter p: that row of it is not updated,
        as torch passes over a parameter without a gradient (None: none is).

        Returns:
            ``[B]`` bool masks: the rows with non-finite gradients, and every row not stepped.
        """

    def clip_norm(self, max_norm: float, norm_type: float = 2.0) -> Tensor:
        """Scale each row's gradients to a total norm of at most ``max_norm``; returns the ``[B]`` norms before."""

    def clip_value(self, clip_value: float) -> None:
        """Clamp every gradient element to ``[-clip_value, clip_value]``."""

    def export_row(self, row: int) -> list[dict[str, Tensor]]:
        """Row ``row``'s state in torch's per-parameter format (an empty dict: no state yet)."""

    def import_row(self, row: int, states: Sequence[dict[str, Any]]) -> None:
        """Load row ``row``'s state from torch's per-parameter format."""

    def state_tensors(self) -> list[Tensor]:
        """Every stacked state tensor it holds (memory accounting)."""


# (each trial's optimizer, each trial's parameters in stacked order, the stacked parameters) -> a fast path, or
# the reason there is none for these optimizers
FastPathBuilder = Callable[
    [Sequence[Optimizer], Sequence[Sequence[nn.Parameter]], Sequence[nn.Parameter]], "FastPath | str"
]


@dataclass(frozen=True)
class StepReport:
    """What one ``step`` did, as ``[B]`` bool masks over the rows of ``trial_ids`` (on the group's device).

    ``skipped_loss``: rows skipped because the caller said so (a non-finite loss, or a divergence not read back
    yet); ``skipped_gradients``: rows whose gradients were not finite (a row may be in both: the loss is its
    reason); ``skipped``: every row not stepped (their union, computed if not given). ``on_host`` is True where
    reading the masks costs no device sync (the universal path has read them already).
    """

    trial_ids: tuple[int, ...]
    skipped_loss: Tensor
    skipped_gradients: Tensor
    on_host: bool = False
    skipped: Tensor = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.skipped is None:
            object.__setattr__(self, "skipped", self.skipped_loss | self.skipped_gradients)

    def read(self) -> tuple[list[int], dict[int, str]]:
        """The stepped trials and the skipped ones with the reason (one device sync)."""
        loss, grads = torch.stack([self.skipped_loss, self.skipped_gradients]).tolist()
        stepped = [tid for tid, a, b in zip(self.trial_ids, loss, grads) if not (a or b)]
        skipped = {
            tid: "non-finite loss" if a else "non-finite gradients"
            for tid, a, b in zip(self.trial_ids, loss, grads)
            if a or b
        }
        return stepped, skipped


class TrialScheduler:
    """Stands in, for Lightning, for one trial's LR scheduler; Lightning's stepping rules stay in force.

    Lightning applies ``interval``/``frequency``/``monitor`` per scheduler config and then calls the
    LightningModule's ``lr_scheduler_step(scheduler, metric)``, where the fused module steps the real
    scheduler if its trial is still running. The real state is checkpointed by :class:`TrialGroupOptimizer`.
    """

    def __init__(self, optimizer: TrialGroupOptimizer, trial_id: int, scheduler: Any) -> None:
        self.optimizer = optimizer  # Lightning checks that a scheduler's optimizer was returned to it
        self.trial_id = trial_id
        self.scheduler = scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the real scheduler, unless its trial has left the group."""
        if self.trial_id in self.optimizer.trials:
            self.scheduler.step(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """Only the trial id: the scheduler's state is saved with the group optimizer's."""
        return {"trial_id": self.trial_id}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """No-op: the scheduler's real state comes back with :meth:`TrialGroupOptimizer.load_state_dict`."""


def _record_step(optimizer: Optimizer) -> None:
    """Tell the trial's LR schedulers that the fused update stepped its optimizer in place of ``step()``.

    torch's ``LRScheduler`` wraps ``optimizer.step`` with a function that sets ``optimizer._opt_called``,
    and its first ``step()`` warns that the first value of the schedule is skipped when that flag is unset.
    The fused path updates the trial's parameters without calling ``step()``, so it sets the flag as the
    wrapper would: the warning keeps firing where it is true (a scheduler stepped before any update). torch
    never clears the flag, so it is set once, after the first fused step of each optimizer.
    """
    if hasattr(optimizer.step, "_wrapped_by_lr_sched"):
        optimizer._opt_called = True  # type: ignore[attr-defined]


def clips_by_value(algorithm: Any) -> bool:
    """Whether ``Trainer(gradient_clip_algorithm=...)`` clips by value ("value" or Lightning's enum of it), not norm."""
    return str(getattr(algorithm, "value", algorithm)) == "value"


class TrialGroupOptimizer(Optimizer):
    """Steps B trials' own optimizers (or one fused update) after one fused forward/backward.

    Args:
        group: the stacked state of the group (rows = live trials).
        trials: each live trial's optimizer and schedulers, by trial id.
        path: ``"auto"`` (fused where possible), ``"universal"`` or ``"fused"`` (error where impossible).
        fast_path: builds the fused fast path (``lightning_hydro.fused.step.select_update.select_fused_update``);
            None: every step takes the universal path.
        clipping: clips each trial by its own hook where one pass over the rows cannot (None: no such clipping).
    """

    def __init__(
        self,
        group: StackedState,
        trials: Mapping[int, TrialOptimization],
        *,
        path: OptimizerPath = "auto",
        fast_path: FastPathBuilder | None = None,
        clipping: TrialClipping | None = None,
    ) -> None:
        super().__init__(list(group.params.values()), defaults={})
        # a hyperparameter set here would reach no trial (a callback's warm-up on trainer.optimizers): refused
        self.param_groups = [GroupParamGroup(param_group) for param_group in self.param_groups]
        self.clipping = clipping
        self._own_clipping = False  # a trial clips its own way: every trial is clipped by its own hook
        self.group = group
        self.trials: dict[int, TrialOptimization] = dict(trials)
        self.path: OptimizerPath = path
        self.fast_path = fast_path
        self.fused: FastPath | None = None
        self.fused_unavailable = ""
        self._stacked = list(group.params.values())  # the stacked Parameters keep their identity (see StackedState)
        self._unflagged: list[Optimizer] = []  # optimizers whose schedulers have not heard of a fused step yet
        self._no_rows = NoRows()  # kept for steps that skip no row
        self._frozen: tuple[Any, Tensor] | None = None  # the latest frozen cells, keyed by the group's frozen rows
        self._within: StepReport | None = None  # the latest step's update ran within training_step (a whole step)
        self.rebuild()

    # -- slot changes (the rows of ``group`` change between materialize() and the call that follows) --------

    def remove_trial(self, trial_id: int) -> None:
        """The trial has left the group's rows: forget its optimizer; the others keep their state."""
        self.trials.pop(trial_id, None)
        self.rebuild()

    def add_trial(self, trial_id: int, optimization: TrialOptimization) -> None:
        """The trial has joined the group's rows with a fresh optimizer."""
        self.trials[trial_id] = optimization
        self.rebuild()

    # -- path selection and state movement ---------------------------------------------------------------

    def _trial_params(self, tid: int) -> list[nn.Parameter]:
        module = self.group.modules[self.group.row_of(tid)]
        return [module.get_parameter(name) for name in self.group.params]

    def materialize(self) -> None:
        """Move fused state into the trials' own optimizers (before the rows change, or to checkpoint)."""
        if self.fused is None:
            return
        for row, tid in enumerate(self.group.trial_ids):
            optimizer = self.trials[tid].optimizer
            for param, state in zip(self._trial_params(tid), self.fused.export_row(row)):
                if state:
                    optimizer.state[param] = state
        self.fused = None

    def rebuild(self) -> None:
        """Choose the path for the current rows; on the fused path, take the trials' state into it."""
        self.materialize()
        self._own_clipping = self.clipping is not None and bool(self.trials) and self.clipping.overridden()
        if self.path == "universal" or not self.trials:
            return
        ids = self.group.trial_ids
        candidate = (
            "no fast path was given (TrialGroupOptimizer(fast_path=None))"
            if self.fast_path is None
            else self.fast_path(
                [self.trials[tid].optimizer for tid in ids],
                [self._trial_params(tid) for tid in ids],
                list(self.group.params.values()),
            )
        )
        if isinstance(candidate, str):
            if self.path == "fused":
                raise ValueError(
                    f"FusedLightningModule(optimizer_path='fused'): the fused optimizer path is unavailable "
                    f"because {candidate}; use optimizer_path='auto' or 'universal'."
                )
            self.fused_unavailable = candidate
            return
        for row, tid in enumerate(ids):
            optimizer = self.trials[tid].optimizer
            candidate.import_row(row, [dict(optimizer.state.get(p, {})) for p in self._trial_params(tid)])
            optimizer.state.clear()
        self.fused = candidate
        self.fused_unavailable = ""
        self._unflagged = [self.trials[tid].optimizer for tid in ids]

    @property
    def active_path(self) -> Literal["universal", "fused"]:
        """The path the next step takes."""
        return "universal" if self.fused is None else "fused"

    def clip_gradients(self, value: float | None, algorithm: Any) -> None:
        """Clip each trial's gradients as Lightning clips one module's (``configure_gradient_clipping``).

        On the fused path, when no trial clips its own way, every row in one pass by its own norm or value (the
        norms are kept: they tell the update which rows are not finite); otherwise each trial by its own hook.

        Args:
            value: ``Trainer(gradient_clip_val=...)`` (None or 0: no clipping, unless a trial clips its own way).
            algorithm: ``Trainer(gradient_clip_algorithm=...)`` ("norm" or "value", or Lightning's enum of them).
        """
        if self._within is not None:
            return  # a whole step clipped within training_step
        if self.fused is not None and not self._own_clipping:
            if value:
                if clips_by_value(algorithm):
                    self.fused.clip_value(float(value))
                else:
                    self.fused.clip_norm(float(value))
        elif self.clipping is not None and (value or self._own_clipping):
            self.clipping.clip(value, algorithm)

    @property
    def own_clipping(self) -> bool:
        """Whether a running trial clips its own way (then every trial is clipped by its own hook)."""
        return self._own_clipping

    # -- torch.optim.Optimizer API -------------------------------------------------------------------------

    @override
    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.group.params.values():
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad.zero_()
        if self.fused is None:
            self.group.clear_trial_grads()

    def _non_finite_gradients(self) -> Tensor:
        """``[B]`` bool: rows whose gradients hold a NaN or inf (stays on the device)."""
        grads = [p.grad for p in self.group.params.values() if p.grad is not None]
        if not grads:
            return self.no_rows()
        return ~torch.isfinite(row_sums(grads, concatenate=False))  # (an overflow to inf counts too)

    @override
    def step(  # type: ignore[override]
        self,
        closure: Callable[[], Any] | None = None,
        *,
        skip: RowsToSkip | None = None,
        without_gradients: Callable[[], Sequence[int]] | None = None,
    ) -> StepReport | None:
        """Run the closure, then update every row that ``skip`` does not name and whose gradients are finite.

        Args:
            closure: Lightning's closure (forward, backward, clipping).
            skip: the rows not to step (a non-finite loss), read after the closure ran.
            without_gradients: gives, after the closure ran, the trials whose steps returned no loss since the last
                step (their rows hold zeros from the others' backward): each is stepped as alone with no gradient,
                which torch's optimizers pass over (no update, no state change). They are not counted as skipped.

        Returns:
            What was stepped and skipped, or None if the closure produced no gradients (nothing updated).
        """
        if closure is not None:
            with torch.enable_grad():
                closure()
        if self._within is not None:  # the whole step updated every row within the closure: report it
            report, self._within = self._within, None
            self._flag_stepped()
            return report
        if all(p.grad is None for p in self._stacked):
            return None  # the step returned None: nothing to update, as for any torch optimizer
        ids = self.group.trial_ids
        by_loss = None if skip is None else skip.rows_to_skip(ids)
        gradless = [] if without_gradients is None else [self.group.row_of(tid) for tid in without_gradients()]
        if self.fused is not None:  # one update of every row on the device; read back only where that is free
            read = skip is not None and skip.reads_each_step(self.group.device)
            param_groups = [self.trials[tid].optimizer.param_groups for tid in ids]
            rows: Tensor | tuple[()] = () if by_loss is None else by_loss
            passed = None
            if gradless:  # left out of the update, and not reported as skipped
                passed = torch.zeros(len(ids), dtype=torch.bool)
                passed[gradless] = True
                passed = passed.to(self.group.device)
                rows = passed if by_loss is None else by_loss | passed
            by_grads, skipped = self.fused.step(param_groups, rows, read=read, frozen=self._frozen_cells())
            if passed is not None:
                by_grads, skipped = by_grads & ~passed, skipped & ~passed
            self._flag_stepped()
            return StepReport(tuple(ids), self.no_rows() if by_loss is None else by_loss, by_grads, skipped=skipped)
        if by_loss is None:
            by_loss = self.no_rows()
        report = StepReport(tuple(ids), by_loss, self._non_finite_gradients() & ~by_loss, on_host=True)
        stepped, _ = report.read()  # the universal path steps trial by trial: it must know which on the host
        self.group.distribute_grads([row for row in map(self.group.row_of, stepped) if row not in gradless])
        self.group.clear_trial_grads(gradless)
        for tid in stepped:
            self.trials[tid].optimizer.step()
        return report

    def _frozen_cells(self) -> Tensor | None:
        """``[P, B]`` bool: the rows of each stacked parameter whose trial froze it while others train it (None: none).

        Made on the host and copied to the device only when the frozen rows change (a trial's hook froze or unfroze).
        """
        frozen = self.group.frozen
        if not frozen:
            return None
        key = (self.group.size, tuple(frozen.items()))
        if self._frozen is None or self._frozen[0] != key or self._frozen[1].device != self.group.device:
            cells = torch.zeros(len(self.group.params), self.group.size, dtype=torch.bool)
            for index, name in enumerate(self.group.params):
                cells[index, list(frozen.get(name, ()))] = True
            self._frozen = (key, cells.to(self.group.device))
        return self._frozen[1]

    def stepped_within(self, report: StepReport) -> None:
        """The fused update ran within ``training_step`` (a whole step): ``step`` reports it, clipping passes."""
        self._within = report

    def _flag_stepped(self) -> None:
        """Tell the trials' schedulers, once, that their optimizers have stepped (else torch warns of the order)."""
        if self._unflagged:
            for optimizer in self._unflagged:
                _record_step(optimizer)
            self._unflagged = []

    def no_rows(self) -> Tensor:
        """An all-False ``[B]`` mask on the group's device (made once per group size)."""
        return self._no_rows(self.group.size, self.group.device)

    @override
    def state_dict(self) -> dict[str, Any]:
        fused = self.fused is not None
        self.materialize()
        state = {
            "trials": {tid: t.optimizer.state_dict() for tid, t in self.trials.items()},
            "schedulers": {tid: [s.scheduler.state_dict() for s in t.schedulers] for tid, t in self.trials.items()},
        }
        if fused:
            self.rebuild()
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.materialize()
        missing = [tid for tid in self.trials if tid not in state_dict["trials"]]
        if missing:
            raise KeyError(f"The checkpoint has no optimizer state for trials {missing}.")
        for tid, trial in self.trials.items():
            trial.optimizer.load_state_dict(state_dict["trials"][tid])
            for spec, sched_state in zip(trial.schedulers, state_dict["schedulers"][tid]):
                spec.scheduler.load_state_dict(sched_state)
        self.rebuild()

    @override
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if self.param_groups:  # only the constructor may add the stacked parameters
            raise RuntimeError("TrialGroupOptimizer manages its parameters itself; add trials to the group instead.")
        super().add_param_group(param_group)
