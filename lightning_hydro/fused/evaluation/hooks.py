"""``EvaluationHooks``: the fused module's hooks of validation, test and predict, read in one place.

Lightning runs a LightningModule's evaluation through these hooks;
:class:`~lightning_hydro.fused.module.FusedLightningModule` takes them from here, as Lightning's own
``LightningModule`` takes its hooks from a few classes (``ModelHooks``, ``DataHooks``, ``CheckpointHooks``). Each
hook hands on, a line or two each:

- the trials' train/eval modes around evaluation (:class:`.modes.TrialModes`; a trial's own
  ``on_validation_model_eval`` / ``on_validation_model_train``, and test/predict variants, set its own), and the
  evaluation layout that lets ``trainer.test`` / ``validate`` / ``predict`` evaluate every trial, the ended ones too
  (:class:`.steps.EvaluationSteps`);
- the steps: one backend call for every trial, what they log booked per trial (with several dataloaders, under
  each loader's names: ``"val_loss/dataloader_idx_1"``), predictions by trial id;
- the trials' own batch-level hooks, each with its own outputs (:mod:`lightning_hydro.fused.lightning.batch_hooks`);
- at an epoch's end, the trials' own epoch hooks and each trial's values published as ``name/trial_{id}``; after
  ``validate`` and ``test``, the best trial's under the unfused names
  (:meth:`~lightning_hydro.fused.logging.publisher.TrialPublisher.publish_chosen_trial`).

The training side (steps, optimization, slots) stays in ``fused/module.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.model_helpers import is_overridden
from typing_extensions import override

from lightning_hydro.backends import LoopBackend, StepOutputs
from lightning_hydro.backends.trial_attributes import differing_modes
from lightning_hydro.fused.evaluation.steps import predictions_by_trial

if TYPE_CHECKING:
    from lightning_hydro.fused.evaluation.modes import TrialModes
    from lightning_hydro.fused.evaluation.steps import EvaluationSteps
    from lightning_hydro.fused.lightning.batch_hooks import TrialBatchHooks
    from lightning_hydro.fused.logging.metrics import TrialMetrics
    from lightning_hydro.fused.logging.publisher import TrialPublisher
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["EvaluationHooks"]


class EvaluationHooks(L.LightningModule):
    """Validation, test and predict hooks of a fused group (a part of ``FusedLightningModule``, not used alone)."""

    # the fused module's parts these hooks hand on to (set by FusedLightningModule.__init__)
    _eval_steps: EvaluationSteps
    _modes: TrialModes
    _metrics: TrialMetrics
    _publisher: TrialPublisher
    _batch_hooks: TrialBatchHooks
    _step_out: StepOutputs | None

    # what FusedLightningModule provides
    @property
    def _group(self) -> StackedState:
        raise NotImplementedError

    def _first(self) -> L.LightningModule:
        raise NotImplementedError

    def _forward_hook(self, hook: str) -> None:
        raise NotImplementedError

    def _end_fit_if_empty(self) -> None:
        raise NotImplementedError

    def _stop_requested_trials(self) -> None:
        raise NotImplementedError

    def _publish_chosen_trial(self, stage: str) -> None:
        raise NotImplementedError

    def read_health(self) -> None:
        """Read the rows' health back from the device (FusedLightningModule's)."""
        raise NotImplementedError

    @override
    def on_validation_model_eval(self) -> None:
        self._eval_steps.enter(self.trainer)
        self._modes.capture(self, self._group.modules)
        super().on_validation_model_eval()
        self._trials_model_eval("on_validation_model_eval", "validation_step")

    @override
    def on_validation_model_train(self) -> None:
        self._trials_model_train("on_validation_model_train")
        self._eval_steps.leave()

    @override
    def on_test_model_eval(self) -> None:
        self._eval_steps.enter(self.trainer)
        self._modes.capture(self, self._group.modules)
        super().on_test_model_eval()
        self._trials_model_eval("on_test_model_eval", "test_step")

    @override
    def on_test_model_train(self) -> None:
        self._trials_model_train("on_test_model_train")
        self._eval_steps.leave()

    @override
    def on_predict_model_eval(self) -> None:
        self._eval_steps.enter(self.trainer)
        self._modes.capture(self, self._group.modules)
        super().on_predict_model_eval()
        self._trials_model_eval("on_predict_model_eval", "predict_step")

    @override
    def on_predict_end(self) -> None:
        self._modes.restore()  # (Lightning has no on_predict_model_train: it restores the recorded modes)
        self._eval_steps.leave()

    def _overriding(self, hook: str) -> list[L.LightningModule]:
        return [m for m in self._group.modules if is_overridden(hook, m, L.LightningModule)]  # type: ignore[misc]

    def _trials_model_eval(self, hook: str, step: str) -> None:
        """The trials' own ``hook`` sets their modes, from those they had, as alone (the others are in eval mode).

        One template runs ``step`` for every trial under vmap and hfta: modes that differ between trials move
        ``step`` to the loop, each trial in its own modes.
        """
        for module in self._overriding(hook):
            self._modes.put_back(module)  # Lightning's default eval() is not applied to a module that overrides it
        self._forward_hook(hook)
        paths = differing_modes(self._group.modules)
        if paths and not isinstance(self._eval_steps.backend(step), LoopBackend):
            where = ", ".join(repr(path) if path else "the root module" for path in paths)
            message = (
                f"the trials' {hook} left {where} in different modes (train/eval) between trials; "
                f"backend={self._eval_steps.backend(step).name!r} runs one template's {step} for every trial, "
                f"so {step} runs per trial with backend='loop' from now on (training is unaffected)."
            )
            self._eval_steps.policy.eval_on_loop(step, message, warn=True)

    def _trials_model_train(self, hook: str) -> None:
        """The recorded modes back, but for the trials that override ``hook``: it sets theirs, as alone."""
        self._modes.restore(keep=self._overriding(hook))
        self._forward_hook(hook)

    @override
    def val_dataloader(self) -> Any:
        return self._first().val_dataloader()

    @override
    def test_dataloader(self) -> Any:
        return self._first().test_dataloader()

    @override
    def predict_dataloader(self) -> Any:
        return self._first().predict_dataloader()

    @override
    def forward(self, *args: Any) -> Any:
        """Every running trial's forward on the same input, stacked along a leading trial dimension."""
        return self._eval_steps.run("forward", *args).output

    @override
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int | None = None) -> None:
        out = self._step_out = self._eval_steps.step("validation_step", self._first(), batch, batch_idx, dataloader_idx)
        self._metrics.record_step("validate", "validation_step", out.logs, self._group.trial_ids, batch)

    @override
    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int | None = None) -> None:
        out = self._step_out = self._eval_steps.step("test_step", self._first(), batch, batch_idx, dataloader_idx)
        self._metrics.record_step("test", "test_step", out.logs, self._group.trial_ids, batch)

    @override
    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int | None = None) -> dict[int, Any]:
        """Each running trial's prediction for the batch, by trial id."""
        out = self._step_out = self._eval_steps.step("predict_step", self._first(), batch, batch_idx, dataloader_idx)
        return predictions_by_trial(out, self._group.trial_ids)

    @override
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int | None = None) -> None:
        self._eval_batch_hook("on_validation_batch_start", None, batch, batch_idx, dataloader_idx)

    @override
    def on_validation_batch_end(
        self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int | None = None
    ) -> None:
        self._eval_batch_hook("on_validation_batch_end", self._step_out, batch, batch_idx, dataloader_idx)
        self._publisher.publish_evaluation_step("validate", self.log)

    @override
    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int | None = None) -> None:
        self._eval_batch_hook("on_test_batch_start", None, batch, batch_idx, dataloader_idx)

    @override
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int | None = None) -> None:
        self._eval_batch_hook("on_test_batch_end", self._step_out, batch, batch_idx, dataloader_idx)
        self._publisher.publish_evaluation_step("test", self.log)

    @override
    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int | None = None) -> None:
        self._eval_batch_hook("on_predict_batch_start", None, batch, batch_idx, dataloader_idx)

    @override
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int | None = None) -> None:
        self._eval_batch_hook("on_predict_batch_end", self._step_out, batch, batch_idx, dataloader_idx)

    def _eval_batch_hook(
        self, hook: str, out: StepOutputs | None, batch: Any, batch_idx: int, dataloader_idx: int | None
    ) -> None:
        # Lightning passes dataloader_idx only with several dataloaders, and names what is logged by it then: what the
        # trials log in this batch (step and batch hooks) is booked under the loader's names
        self._metrics.dataloader_idx = dataloader_idx
        # the trials get what Lightning passed
        if hook in self._batch_hooks.overridden:
            rest = () if dataloader_idx is None else (dataloader_idx,)
            self._batch_hooks.eval_batch(hook, out, batch, batch_idx, *rest)

    @override
    def on_validation_epoch_start(self) -> None:
        fitting = self._trainer is not None and self.trainer.state.fn == TrainerFn.FITTING
        if fitting and not self.trainer.sanity_checking:
            self.read_health()  # validation inside an epoch: its decisions must see every divergence so far
        self._metrics.forget_step_values("validate")  # as Lightning starts each evaluation run's results afresh
        self._forward_hook("on_validation_epoch_start")

    @override
    def on_validation_epoch_end(self) -> None:
        self._metrics.dataloader_idx = None  # Lightning's epoch-end hooks log without a loader's suffix
        self._forward_hook("on_validation_epoch_end")
        self._publisher.publish_epoch("validate", self.log, sanity_checking=self.trainer.sanity_checking)

    @override
    def on_validation_end(self) -> None:
        if self.trainer.state.fn == TrainerFn.FITTING and not self.trainer.sanity_checking:
            self._stop_requested_trials()  # asked in their own validation hooks
            self._end_fit_if_empty()  # after the callbacks' on_validation_end, where early stopping decides
        elif self.trainer.state.fn == TrainerFn.VALIDATING:
            self._publish_chosen_trial("validate")

    @override
    def on_test_epoch_start(self) -> None:
        self._metrics.forget_step_values("test")
        self._forward_hook("on_test_epoch_start")

    @override
    def on_test_epoch_end(self) -> None:
        self._metrics.dataloader_idx = None
        self._forward_hook("on_test_epoch_end")
        self._publisher.publish_epoch("test", self.log, sanity_checking=self.trainer.sanity_checking)

    @override
    def on_test_end(self) -> None:
        self._publish_chosen_trial("test")
