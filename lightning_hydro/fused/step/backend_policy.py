"""``BackendPolicy``: which backend runs a fused group's steps, and when that changes.

The policy holds the backend the user asked for (``"auto"``, ``"vmap"``, ``"hfta"``, ``"loop"``) and the one in
use, and applies the rules that change it:

- the first training batch: ``"auto"`` times the candidates on it (or, ``deterministic``, takes the first that
  runs) and keeps the fastest;
- fusion verification: each trial's fused loss and gradients are checked against its own module on its first
  batch; a mismatch is an error, or under ``"auto"`` a move to the loop;
- evaluation fallbacks: a validation/test/predict method that cannot run fused runs per trial on the loop,
  training unaffected (torchmetrics calls run fused: see :mod:`lightning_hydro.backends.deferred_metrics`);
- group-size changes: under ``"auto"`` a group left with one trial runs it on the loop (nothing to batch) and a
  newcomer brings the timed choice back; a newcomer whose Python settings differ is refused (or moves the group
  to the loop under ``"auto"``).

It knows nothing of Lightning's hooks; the fused module calls it from them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from lightning_hydro.backends import (
    Backend,
    CompileSetting,
    FusionError,
    LoopBackend,
    StepOutputs,
    VmapBackend,
    make_backend,
)
from lightning_hydro.backends.auto import AutoChoice
from lightning_hydro.backends.deferred_metrics import deferred_note, preserved_metric_states
from lightning_hydro.fused.group.slots import TrialSlots
from lightning_hydro.fused.verify.fusion import verify_fusion

__all__ = ["BackendPolicy", "Chooser"]

Chooser = Callable[..., AutoChoice]  # lightning_hydro.backends.auto.choose_backend's signature


class BackendPolicy:
    """The backend of a fused group and the rules that change it.

    Args:
        requested: the ``backend=`` argument of the fused module.
        slots: the group's slots (the stacked state the backends run on).
        verify: check each trial's first fused batch against its own module.
        deterministic: under ``"auto"``, choose without timing.
        compile: run the vmap/hfta training step under torch.compile (see
            :mod:`lightning_hydro.backends.compiled_step`); ``"auto"`` times the candidates eagerly and keeps a
            fused one (the loop only where neither hfta nor vmap runs the model).
    """

    def __init__(
        self,
        requested: str,
        slots: TrialSlots,
        *,
        verify: bool,
        deterministic: bool,
        compile: CompileSetting = False,
    ) -> None:
        self.requested = requested
        self.slots = slots
        self.compile: CompileSetting = compile
        self.deterministic = deterministic
        self.verify_enabled = verify
        self.verify_ids: set[int] = set(slots.trial_ids) if verify else set()
        self.backend: Backend | None = None if requested == "auto" else self._make(requested)
        self.parked: Backend | None = None  # auto's choice, set aside while a lone trial runs on the loop
        self.lone = False  # auto started with one trial: the loop, untimed; a second trial makes it choose
        self.eval_fallback: dict[str, Backend] = {}
        self.unbuilt: str | None = None  # restored for a group with no running trial: no rows to build it on
        self.report = ""
        if self.backend is not None:
            slots.book.set_backend(slots.trial_ids, self.backend.name)

    def _make(self, name: str) -> Backend:
        """The training backend ``name``, compiled if asked (the loop runs eagerly: said once)."""
        if name == "loop" and self.compile:
            rank_zero_info("FusedLightningModule: compile applies to the vmap and hfta backends; 'loop' runs eagerly.")
        return make_backend(name, self.slots.group, compile=self.compile)

    @property
    def name(self) -> str | None:
        """The backend in use (None until ``"auto"`` has chosen)."""
        return None if self.backend is None else self.backend.name

    @property
    def recorded_name(self) -> str | None:
        """The backend a resumed run should use: auto's timed choice, even while parked for a lone trial."""
        if self.lone:
            return None  # nothing was timed: a resumed run decides again
        if self.backend is None:
            return self.unbuilt
        return self.name if self.parked is None else self.parked.name

    def _to_loop(self, reason: str) -> None:
        message = f"FusedLightningModule: backend='auto' runs the group on 'loop' from now on: {reason}"
        rank_zero_warn(message)
        if self.report:  # what was chosen first, then why the loop runs it now
            first = self.report.removeprefix("FusedLightningModule: ")
            message = f"{message.removesuffix('.')} (first: {first.removesuffix('.')})."
        self.report = message
        self.backend, self.parked = make_backend("loop", self.slots.group), None
        self.slots.book.set_backend(self.slots.trial_ids, "loop")

    def after_refusal(self, err: FusionError, backend: Backend, batch: Any, batch_idx: int) -> StepOutputs:
        """The step ``backend`` refused with ``err``: under ``"auto"`` the loop runs it from now on, else ``err``.

        A fused backend may refuse a step long after the first batch: when the trials' Python state comes to
        differ in a value the step uses (:mod:`lightning_hydro.backends.step_state`). The refused call changed
        nothing, so the loop runs the same step.
        """
        if self.requested != "auto" or isinstance(backend, LoopBackend):
            raise err
        self._to_loop(str(err))
        assert self.backend is not None
        return self.backend.run("training_step", batch, batch_idx)

    # -- training ---------------------------------------------------------------------------------------------

    def for_training(self, run_step: Callable[[Backend], None], choose: Chooser, model_name: str) -> Backend:
        """The backend for a training step; on the first batch under ``"auto"``, choose it.

        Args:
            run_step: one forward and backward of the batch with a candidate backend (for timing).
            choose: the chooser (:func:`lightning_hydro.backends.auto.choose_backend`).
            model_name: the trial class's name, for messages.
        """
        if self.backend is not None:
            return self.backend
        group = self.slots.group
        # nothing to batch: the trial's own module, as in a plain run (no timing); under compile a fused backend
        # compiles the lone trial's whole step, which the eager loop does not
        if group.size == 1 and not self.compile:
            self.backend, self.lone = make_backend("loop", group), True
            self.slots.book.set_backend(self.slots.trial_ids, "loop")
            self.report = "FusedLightningModule: backend='auto' runs a group of one trial on 'loop' (nothing to batch)."
            rank_zero_info(self.report)
            return self.backend
        candidates = [(name, partial(make_backend, name, group)) for name in ("hfta", "vmap", "loop")]
        # compile applies to the fused backends: auto keeps one of them (timed eagerly: compiled, each runs faster)
        # and the eager loop only when neither runs the model; the loop's time still weighs fusion in the report
        fused_only = {
            "eligible": ("hfta", "vmap"),
            "why_eligible": f"compile={self.compile!r} applies to hfta and vmap, timed here eagerly",
        }
        with preserved_metric_states(group.modules):  # timing steps must not count in torchmetrics
            choice = choose(
                group, candidates, run_step, timed=not self.deterministic, **(fused_only if self.compile else {})
            )
        self.backend = choice.backend if not self.compile else self._make(choice.backend.name)
        self.slots.book.set_backend(self.slots.trial_ids, choice.backend.name)
        self.report = f"FusedLightningModule: {choice.describe()}{deferred_note(choice.backend)}."
        rank_zero_info(self.report)
        return choice.backend

    def verify(self, backend: Backend, batch: Any, batch_idx: int) -> Backend:
        """Check the trials not yet verified on this batch; returns the backend to run it with."""
        group = self.slots.group
        ids = [tid for tid in group.trial_ids if tid in self.verify_ids]
        # the loop runs each trial's own code: nothing to check; otherwise a skipped batch checks the next one
        try:
            with preserved_metric_states(group.modules):  # the checked steps must not count in torchmetrics
                if (
                    ids
                    and not isinstance(backend, LoopBackend)
                    and not verify_fusion(group, backend, ids, batch, batch_idx)
                ):
                    return backend
        except FusionError as err:  # a mismatch, or a fused backward that cannot run (activation checkpointing)
            if self.requested != "auto":
                raise
            self._to_loop(str(err))
        self.verify_ids.difference_update(ids)
        return self.backend or backend

    # -- evaluation -------------------------------------------------------------------------------------------

    def for_eval(self, method: str) -> Backend:
        """The backend for an evaluation method (a fallback once one was needed)."""
        if method in self.eval_fallback:
            return self.eval_fallback[method]
        if self.backend is not None:
            return self.backend
        # backend="auto" has not timed anything yet (e.g. the sanity check before the first training batch)
        return self.eval_fallback.setdefault("auto", make_backend("loop", self.slots.group))

    def eval_on_loop(self, method: str, message: str, *, warn: bool) -> Backend:
        """From now on ``method`` runs per trial on the loop; ``message`` says why (once)."""
        (rank_zero_warn if warn else rank_zero_info)(f"FusedLightningModule: {message}")
        backend = self.eval_fallback[method] = make_backend("loop", self.slots.group)
        return backend

    # -- slot changes -----------------------------------------------------------------------------------------

    def check_newcomer(self, module: nn.Module, trial_id: int) -> None:
        """A newcomer that differs in a Python value the fused code reads: refused, or auto moves to the loop."""
        backend = self.parked or self.backend
        if not isinstance(backend, VmapBackend):
            return
        group = self.slots.group
        refusal = backend.refusal([*group.modules, module], [*group.trial_ids, trial_id])
        if refusal is None:
            return
        if self.requested != "auto":
            try:
                raise refusal
            finally:  # break the frame -> error -> traceback -> frame cycle
                refusal = None
        self._to_loop(str(refusal))

    def trial_added(self, trial_id: int) -> None:
        """Record the newcomer's backend; verify it on its first batch."""
        self.group_changed()
        if self.backend is not None:
            self.slots.book.set_backend([trial_id], (self.backend if self.parked is None else self.parked).name)
        if self.verify_enabled and self.requested != "loop":
            self.verify_ids.add(trial_id)

    def trial_removed(self, trial_id: int) -> None:
        """Forget a stopped trial."""
        self.verify_ids.discard(trial_id)
        self.group_changed()

    def rebind(self) -> None:
        """The rows or devices changed: every backend drops what it cached about them."""
        for backend in [self.backend, *self.eval_fallback.values()]:
            if backend is not None:
                backend.rebind()

    def group_changed(self) -> None:
        """Rebind, and with ``backend="auto"`` run a lone trial on the loop (a newcomer undoes that).

        auto times the backends once, on the first batch, and its choice stays while early stopping shrinks the
        group, except at one trial: then there is nothing to batch, and the loop runs the trial's own module
        faster (1.8-1.9x on the digits MLP, 1.4x on ResNet-18: docs/fused.md, docs/hfta.md); the same
        results to float rounding. A group that starts with one trial runs it on the loop without timing, and
        chooses by timing once a second trial joins. Not under ``compile=``: the loop runs eagerly, and a lone
        trial's compiled whole step on vmap was 1.2-1.5x faster than it on this CPU (docs/fused.md).
        """
        self.rebind()
        if self.requested != "auto" or (self.backend is None and self.parked is None):
            return
        size = self.slots.group.size
        if self.lone:
            if size > 1:  # a group that started with one trial has grown: time the candidates on its next batch
                self.backend, self.lone = None, False
            return
        if size == 1 and self.parked is None and not isinstance(self.backend, LoopBackend) and not self.compile:
            self.parked, self.backend = self.backend, make_backend("loop", self.slots.group)
            rank_zero_info("FusedLightningModule: one trial left; backend='auto' runs it on 'loop' from now on.")
        elif size > 1 and self.parked is not None:
            self.backend, self.parked = self.parked, None
            self.backend.rebind()
            rank_zero_info(f"FusedLightningModule: {size} trials; back to {self.backend.name!r}.")

    def restore(self, name: str | None) -> None:
        """After a checkpoint was loaded into new stacked state: use the recorded backend (no re-verification)."""
        self.verify_ids.clear()
        name = name or self.requested
        self.parked, self.lone = None, False
        self.eval_fallback.clear()
        if not self.slots.group.size:  # every trial had ended: an evaluation builds it on the trials it stacks
            self.backend, self.unbuilt = None, None if name == "auto" else name
            return
        self.backend, self.unbuilt = None if name == "auto" else self._make(name), None
        self.group_changed()
