"""``TrainingStep``: the forward half of a fused step, from Lightning's batch to the loss it runs backward on.

Lightning calls the fused module's ``training_step`` inside its closure. For a group of B trials it

1. runs every trial's own ``training_step`` with its row of the stacked state in one call of the group's backend
   (each trial's Python state swapped in around it). On the first batches :mod:`.backend_policy` is asked first:
   ``backend="auto"`` times the candidates, and each trial's first batch is verified against its own module; a
   fused backend that refuses a later step hands over to the loop there too;
2. books what the trials logged, per trial, on the device
   (:meth:`~lightning_hydro.fused.logging.metrics.TrialMetrics.record_step`);
3. records which ``[B]`` losses are finite (:mod:`.row_health`; under DDP a row bad on any rank is bad on all,
   :mod:`lightning_hydro.fused.rank_sync`) and returns the sum of the finite ones: each trial's gradient is then
   its own (a sum, not a mean), and a non-finite trial adds nothing.

None of this reads a value back to the host (DDP's agreement on bad rows is one collective on the device), except
where a read costs no wait (the CPU, the group's health read back every step): there the sum is read, and a
finite one is returned as it is (the same value and gradients as the masked sum, with fewer ops).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lightning_hydro.backends import Backend, StepOutputs
from lightning_hydro.backends.batch_copies import tensors_copied
from lightning_hydro.backends.errors import FusionError, explain_backward_error
from lightning_hydro.fused.logging.metrics import TrialMetrics
from lightning_hydro.fused.rank_sync import RankSync
from lightning_hydro.fused.step.backend_policy import BackendPolicy, Chooser
from lightning_hydro.fused.step.row_health import RowHealth, sum_of_finite
from lightning_hydro.fused.step.whole_step import WholeStep

__all__ = ["TrainingStep"]


class TrainingStep:
    """The fused module's ``training_step``: one backend call for every trial, the losses' health, their sum.

    Args:
        policy: the group's backend policy (it holds the slots).
        metrics: books the trials' logged values per trial.
        health: records which rows' losses are finite.
        ranks: the processes that train the group (DDP), or one.
        model_name: the trials' class name, for messages.
    """

    def __init__(
        self, policy: BackendPolicy, metrics: TrialMetrics, health: RowHealth, ranks: RankSync, model_name: str
    ) -> None:
        self.policy = policy
        self.metrics = metrics
        self.health = health
        self.ranks = ranks
        self.model_name = model_name
        self.backend_name = "auto"  # the backend of the latest step (its backward's errors are explained for it)
        # the latest step's batch, outputs and [B] losses (the trials' own batch hooks get their shares)
        self.batch: Any = None
        self.outputs: StepOutputs | None = None
        self.losses: Tensor | None = None
        # with compile=: a steady step's forward, backward, clipping and update as one compiled function
        self.whole = WholeStep(policy.compile)
        self._whole_ran = False  # the latest step ran whole: Lightning's backward has nothing left to do
        # the trials whose step returned a loss since the last optimizer step; None: every trial did (the usual case)
        self._with_loss: set[int] | None = None
        self._window_batches = 0  # the batches since the last optimizer step (gradient accumulation's window)
        self._left_out: set[int] = set()  # trials whose own optimizer_step cleared their gradients (see leave_out)

    def __call__(self, batch: Any, batch_idx: int, chooser: Callable[[], Chooser]) -> Tensor | None:
        """The loss Lightning runs backward on (None: every trial has stopped, or the step returned None).

        Args:
            batch: Lightning's batch.
            batch_idx: its index.
            chooser: gives ``backend="auto"``'s chooser (:func:`lightning_hydro.backends.auto.choose_backend`;
                several processes take rank zero's choice); asked only while the backend is not settled.
        """
        self._drop_graph()
        self._whole_ran = False
        policy = self.policy
        group = policy.slots.group
        if not group.trial_ids:
            return None  # every trial has stopped (the module's on_train_batch_start skips such batches)
        group.follow_requires_grad()  # a trial's hooks may have frozen or unfrozen its parameters
        backend = policy.backend
        if backend is None or policy.verify_ids:  # not settled: auto has not chosen, or a trial is unverified
            # each timing run on a copy of the batch: the step may change it (batch["x"] = ..., x.sub_(...))
            step = lambda candidate: self.forward_backward(candidate, tensors_copied(batch), batch_idx)  # noqa: E731
            backend = policy.for_training(step, chooser(), self.model_name)
            if policy.verify_ids:
                backend = policy.verify(backend, batch, batch_idx)
        if self.whole.setting and self.whole.usable(backend, policy.slots.optimizer):
            loss = self._run_whole(backend, batch, batch_idx)
            if loss is not None:
                return loss
        try:
            out = backend.run("training_step", batch, batch_idx)
        except FusionError as err:
            out = policy.after_refusal(err, backend, batch, batch_idx)
        self.backend_name = (policy.backend or backend).name
        self.metrics.record_step("train", "training_step", out.logs, group.trial_ids, batch)
        self.batch, self.outputs, self.losses = batch, out, None
        loss = out.loss()
        self._note_losses(group.trial_ids, range(group.size) if loss is None else out.without_output)
        if out.without_output and self.ranks.world_size > 1:
            skipping = [group.trial_ids[row] for row in out.without_output]
            raise RuntimeError(
                f"{self.model_name}.training_step returned None for trials {skipping} under {self.ranks.world_size} "
                "processes. Lightning does not support skipping a training step by returning None in distributed "
                "training (it raises this for each trial alone too): return a loss, e.g. loss * 0 to skip a batch."
            )
        if loss is None:
            return None
        loss = self.losses = loss.reshape(group.size)
        if self.ranks.world_size > 1:
            loss = self.ranks.losses(loss)  # a row bad on any rank is skipped on all
        health = self.health
        if health.reads_each_step(loss.device):  # a read costs no wait (the CPU): the plain sum, if it is finite
            total = loss.sum()
            if math.isfinite(total.item()):  # every loss is (an overflow only sends it the masked way)
                health.record_finite_losses(group.trial_ids)
                return total
        bad = health.record_losses(group.trial_ids, loss)  # stays on the device: no host sync
        return sum_of_finite(loss, bad)

    def _note_losses(self, trial_ids: list[int], without: Any) -> None:
        """Book which trials' steps returned no loss in this batch (``without``: their rows)."""
        if without:
            with_loss = {tid for row, tid in enumerate(trial_ids) if row not in without}
            if self._with_loss is None:  # every trial had a loss in the window's batches before this one
                self._with_loss = set(trial_ids) if self._window_batches else with_loss
            else:
                self._with_loss |= with_loss
        elif self._with_loss is not None:
            self._with_loss.update(trial_ids)
        self._window_batches += 1

    def without_gradients(self) -> list[int]:
        """The trials whose steps returned no loss since the last optimizer step: they have no gradient to step on.

        Alone, Lightning runs no backward for a step that returns None, and the optimizer's ``step`` passes over
        parameters without a gradient; in a group the other trials' backward gives those rows zeros, so the group
        optimizer must be told. Empty in the usual case (every trial returned a loss), at no cost.
        """
        if self._with_loss is None and not self._left_out:
            return []
        with_loss = self._with_loss
        return [
            tid
            for tid in self.policy.slots.group.trial_ids
            if (with_loss is not None and tid not in with_loss) or tid in self._left_out
        ]

    def leave_out(self, trial_id: int) -> None:
        """A trial whose own ``optimizer_step`` cleared its gradients: stepped with none in this step (no update).

        As alone, where ``optimizer.zero_grad()`` between the closure and ``optimizer.step()`` skips the update.
        """
        self._left_out.add(trial_id)

    def rows_without_loss(self) -> tuple[int, ...]:
        """The rows whose step returned None in the latest batch while others returned a loss."""
        return () if self.outputs is None else self.outputs.without_output

    def no_optimizer_step(self) -> None:
        """The trials' ``optimizer_step`` ran the closure and stepped none: what they cleared counts for that batch."""
        self._left_out = set()

    def optimizer_stepped(self) -> None:
        """An optimizer step ended the gradient-accumulation window."""
        self._with_loss, self._window_batches = None, 0
        self._left_out = set()

    def compile_report(self, update_failure: str) -> str:
        """What ``compile=`` did so far, in one line (``update_failure``: why the split step's update runs eagerly)."""
        whole = self.whole
        if not whole.setting:
            return "compile is off"
        text = (
            f"compile={whole.setting!r}: {whole.whole_steps} training steps ran whole (forward, backward and update "
            "as one compiled function)"
        )
        if whole.checks:
            text += (
                f"; {whole.checks} checked against the same step run eagerly, the largest difference "
                f"{whole.worst:.2g} of what float rounding allows"
            )
        if whole.failure:
            text += f"; every later step runs split: {whole.failure}"
        elif whole.reason:
            text += f"; the latest step ran split: {whole.reason}"
        backend = self.policy.backend
        failure = getattr(backend, "compile_failure", "")
        if failure and failure not in text:  # (the whole step's reason may say it already)
            text += f"; the split step's forward and backward run eagerly: {failure}"
        elif backend is not None and backend.name == "loop" and "'loop'" not in text:
            text += "; the 'loop' backend runs eagerly"
        if update_failure:
            text += f"; the split step's update runs eagerly: {update_failure}"
        return text

    def _run_whole(self, backend: Any, batch: Any, batch_idx: int) -> Tensor | None:
        """The step as one compiled function (:mod:`.whole_step`); None: it could not compile (run it split)."""
        optimizer = self.policy.slots.optimizer
        assert optimizer is not None
        ids = self.policy.slots.group.trial_ids
        prior = self.health.rows_to_skip(ids)
        out, report = self.whole.run(
            backend, optimizer, batch, batch_idx, optimizer.no_rows() if prior is None else prior
        )
        if report is None:
            return None
        self.backend_name = backend.name
        self.metrics.record_step("train", "training_step", out.logs, ids, batch)
        self.batch, self.outputs, self.losses = batch, out, self.whole.losses
        optimizer.stepped_within(report)  # the group optimizer reports it; Lightning's backward and clipping pass
        self._whole_ran = True
        return self.whole.total

    def _drop_graph(self) -> None:
        """Keep the latest outputs without their autograd graph, and forget the losses.

        A graph kept past its step would keep the stacked parameters' gradient accumulators of that step alive; once
        a slot change has resized the parameters, the next backward would reuse them and fail on the old shape.
        """
        self.losses = None
        if self.outputs is not None:
            self.outputs = self.outputs.detached()

    def forward_backward(self, backend: Backend, batch: Any, batch_idx: int) -> None:
        """One forward and backward of ``batch`` with a candidate backend (what ``backend="auto"`` times)."""
        loss = backend.run("training_step", batch, batch_idx).loss()
        if loss is not None:
            self.backend_name = backend.name
            self.backward(sum_of_finite(loss, ~torch.isfinite(loss.detach())))

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """``loss.backward``, a failure a fused backend causes explained (e.g. activation checkpointing).

        After a whole step (its gradients taken and applied already) there is nothing to do.
        """
        if self._whole_ran:
            self._whole_ran = False
            return
        try:
            loss.backward(*args, **kwargs)
            self._drop_graph()
        except RuntimeError as err:  # e.g. activation checkpointing, which recomputes the forward outside vmap
            explained = explain_backward_error(err, backend=self.backend_name, module_name=self.model_name)
            if explained is None:
                raise
            raise explained from err
        group = self.policy.slots.group
        if self.backend_name == "loop":  # reentrant checkpointing differentiates the trials' own parameters
            group.adopt_trial_grads()
        group.drop_frozen_grads()  # a fused backward reaches the rows a trial froze too
