"""``EvaluationSteps``: a fused group's ``forward`` and validation, test and predict steps, run for every trial.

Outside a fit, each evaluation stage runs on an :class:`~lightning_hydro.fused.evaluation.layout.EvaluationLayout`
holding every trial, the ended ones too, entered and left here; the group's slots do not change meanwhile.

Each evaluation method of the user's module runs for every running trial under the group's backend, chosen by
the :class:`~lightning_hydro.fused.step.backend_policy.BackendPolicy`. A method that cannot run fused runs per trial
on the loop from then on (said once, training unaffected). During a fit a group whose every trial has ended
runs nothing; test/validate/predict run every trial, the ended ones too (:mod:`.layout`). The fused
module's hooks call it and book what the steps log.

Example::

    >>> import torch
    >>> from torch import nn
    >>> from lightning_hydro.demos import DigitsMLP
    >>> from lightning_hydro.fused.group.slots import TrialSlots
    >>> slots = TrialSlots(nn.Module(), [DigitsMLP(hidden_dim=8) for _ in range(3)], [0, 1, 2], max_slots=3)
    >>> evaluation = EvaluationSteps(BackendPolicy("vmap", slots, verify=False, deterministic=True))
    >>> evaluation.run("forward", torch.zeros(5, 64)).output.shape  # 3 trials, 5 samples, 10 classes
    torch.Size([3, 5, 10])
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn

from lightning_hydro.backends import Backend, FusionError, LoopBackend, StepOutputs
from lightning_hydro.fused.evaluation.layout import EvaluationLayout
from lightning_hydro.fused.lightning.batch_hooks import outputs_by_row
from lightning_hydro.fused.lightning.strategy_view import TrialOptimizerSource
from lightning_hydro.fused.lightning.trainer_view import attach_trainer
from lightning_hydro.fused.step.backend_policy import BackendPolicy

__all__ = ["EvaluationSteps", "predictions_by_trial"]


class EvaluationSteps:
    """Runs an evaluation method of every running trial, falling back to the loop where fusion cannot run it.

    Args:
        policy: the group's backend policy (it holds the slots).
        optimizers: where each trial's view of the Trainer finds its optimizers.
    """

    def __init__(self, policy: BackendPolicy, optimizers: TrialOptimizerSource | None = None) -> None:
        self.policy = policy
        self.optimizers = optimizers
        self.layout: EvaluationLayout | None = None  # every trial, ended ones too, while test/validate/predict

    def enter(self, trainer: L.Trainer) -> None:
        """Outside a fit, evaluate every trial of the group, the ended ones too: see :mod:`.layout`."""
        self.leave()
        if trainer.state.fn != TrainerFn.FITTING:
            self.layout = EvaluationLayout.enter(self.policy.slots, self.policy)
            for tid, module in self.policy.slots.running():
                attach_trainer(module, trainer, tid, self.optimizers)  # type: ignore[arg-type]

    def refuse_slot_change(self, what: str, trainer: L.Trainer | None) -> None:
        """Raise if an evaluation stage runs: ``what`` (``stop_trial``, ``add_trial``) would change its layout."""
        if self.layout is not None:
            stage = getattr(trainer.state.fn, "value", "an evaluation") if trainer is not None else "an evaluation"
            raise RuntimeError(
                f"{what}: the group's slots change only while it fits; this runs during trainer.{stage}, which "
                "evaluates every trial of the group as it is. Stop or add trials from a callback's fit hooks."
            )

    def leave(self) -> None:
        """Put the fit layout back, if an evaluation layout was entered."""
        layout, self.layout = self.layout, None
        if layout is not None:
            layout.leave()

    def backend(self, method: str) -> Backend:
        """The backend that runs ``method`` now."""
        return self.policy.for_eval(method)

    def run(self, method: str, *args: Any) -> StepOutputs:
        """``method(*args)`` of every running trial (nothing for an empty group)."""
        if not self.policy.slots.trial_ids:
            return StepOutputs(output=None, per_row=[])
        backend = self.backend(method)
        try:
            return backend.run(method, *args)
        except FusionError as err:
            if isinstance(backend, LoopBackend):
                raise
            message = (
                f"{method} cannot run under backend={backend.name!r}, so it runs per trial with backend='loop' "
                f"(training is unaffected). Reason: {err}"
            )
            return self.policy.eval_on_loop(method, message, warn=True).run(method, *args)

    def step(
        self, method: str, module: nn.Module, batch: Any, batch_idx: int, dataloader_idx: int | None
    ) -> StepOutputs:
        """Run a ``*_step`` method, passing ``dataloader_idx`` only where the user's ``module`` takes it."""
        if dataloader_idx is not None and "dataloader_idx" in inspect.signature(getattr(module, method)).parameters:
            return self.run(method, batch, batch_idx, dataloader_idx)
        return self.run(method, batch, batch_idx)


def predictions_by_trial(out: StepOutputs, trial_ids: Sequence[int]) -> dict[int, Any]:
    """Each trial's share of a fused predict step's output, by trial id (row i belongs to ``trial_ids[i]``)."""
    return dict(zip(trial_ids, outputs_by_row(out, len(trial_ids), training=False)))
