"""``TrainingStep``: the forward half of a fused step, from Lightning's batch to the loss it runs backward on.

Lightning calls the fused module's ``training_step`` inside its closure. For a group of B trials it

1. takes the backend the policy says (on the first batch ``backend="auto"`` times the candidates, and each
   trial's first batch is verified against its own module: :mod:`lightning_hydro.fused.backend_policy`);
2. runs every trial's own ``training_step`` with its row of the stacked state in one backend call;
3. books what the trials logged, per trial, on the device (:mod:`lightning_hydro.fused.trial_publisher`);
4. records which ``[B]`` losses are finite (:mod:`.row_health`) and returns the sum of the finite ones: each
   trial's gradient is then its own (a sum, not a mean), and a non-finite trial adds nothing.

None of this reads a value back to the host.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_hydro.backends import Backend
from lightning_hydro.fused.backend_policy import BackendPolicy, Chooser
from lightning_hydro.fused.step.row_health import RowHealth
from lightning_hydro.fused.trial_publisher import TrialPublisher

__all__ = ["TrainingStep"]


class TrainingStep:
    """The fused module's ``training_step``: one backend call for every trial, the losses' health, their sum.

    Args:
        policy: the group's backend policy (it holds the slots).
        publisher: books the trials' logged values per trial.
        health: records which rows' losses are finite.
    """

    def __init__(self, policy: BackendPolicy, publisher: TrialPublisher, health: RowHealth) -> None:
        self.policy = policy
        self.publisher = publisher
        self.health = health

    def __call__(self, batch: Any, batch_idx: int, choose: Chooser, model_name: str) -> Tensor | None:
        """The loss Lightning runs backward on (None: every trial has stopped, or the step returned None).

        Args:
            batch: Lightning's batch.
            batch_idx: its index.
            choose: ``backend="auto"``'s chooser (:func:`lightning_hydro.backends.auto.choose_backend`).
            model_name: the trials' class name, for messages.
        """
        group = self.policy.slots.group
        if not group.trial_ids:
            return None  # every trial has stopped (the module's on_train_batch_start skips such batches)
        backend = self.policy.for_training(
            lambda candidate: self.forward_backward(candidate, batch, batch_idx), choose, model_name
        )
        if self.policy.verify_ids:
            backend = self.policy.verify(backend, batch, batch_idx)
        out = backend.run("training_step", batch, batch_idx)
        self.publisher.record_step("train", "training_step", out.logs, batch)
        loss = out.loss()
        if loss is None:
            return None
        loss = loss.reshape(group.size)
        bad = self.health.record_losses(group.trial_ids, loss)  # stays on the device: no host sync
        return torch.where(bad, 0.0, loss).sum()

    @staticmethod
    def forward_backward(backend: Backend, batch: Any, batch_idx: int) -> None:
        """One forward and backward of ``batch`` with a candidate backend (what ``backend="auto"`` times)."""
        loss = backend.run("training_step", batch, batch_idx).loss()
        if loss is not None:
            torch.where(torch.isfinite(loss.detach()), loss, 0.0).sum().backward()
