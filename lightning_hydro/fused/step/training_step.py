"""``TrainingStep``: the forward half of a fused step, from Lightning's batch to the loss it runs backward on.

Lightning calls the fused module's ``training_step`` inside its closure. For a group of B trials it

1. takes the backend the policy says (on the first batch ``backend="auto"`` times the candidates, and each
   trial's first batch is verified against its own module: :mod:`lightning_hydro.fused.step.backend_policy`);
2. runs every trial's own ``training_step`` with its row of the stacked state in one backend call (each trial's
   Python state swapped in around it: :meth:`~lightning_hydro.fused.step.backend_policy.BackendPolicy.run_training`);
3. books what the trials logged, per trial, on the device (:mod:`lightning_hydro.fused.logging.publisher`);
4. records which ``[B]`` losses are finite (:mod:`.row_health`; under DDP a row bad on any rank is bad on all,
   :mod:`lightning_hydro.fused.rank_sync`) and returns the sum of the finite ones: each trial's gradient is then
   its own (a sum, not a mean), and a non-finite trial adds nothing.

None of this reads a value back to the host (DDP's agreement on bad rows is one collective on the device).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_hydro.backends import Backend
from lightning_hydro.backends.errors import explain_backward_error
from lightning_hydro.fused.logging.publisher import TrialPublisher
from lightning_hydro.fused.rank_sync import RankSync
from lightning_hydro.fused.step.backend_policy import BackendPolicy, Chooser
from lightning_hydro.fused.step.row_health import RowHealth

__all__ = ["TrainingStep", "sum_of_finite"]


def sum_of_finite(losses: Tensor, bad: Tensor) -> Tensor:
    """The loss Lightning runs backward on: the sum of the ``[B]`` losses, the ``bad`` rows' left out.

    A sum, not a mean, so that each trial's gradient is its own; a bad row (a non-finite loss) adds nothing, and
    its gradient is zero.

    Example::

        >>> losses = torch.tensor([1.0, float("nan"), 2.0])
        >>> sum_of_finite(losses, ~torch.isfinite(losses))
        tensor(3.)
    """
    return torch.where(bad, 0.0, losses).sum()


class TrainingStep:
    """The fused module's ``training_step``: one backend call for every trial, the losses' health, their sum.

    Args:
        policy: the group's backend policy (it holds the slots).
        publisher: books the trials' logged values per trial.
        health: records which rows' losses are finite.
        ranks: the processes that train the group (DDP), or one.
        model_name: the trials' class name, for messages.
    """

    def __init__(
        self, policy: BackendPolicy, publisher: TrialPublisher, health: RowHealth, ranks: RankSync, model_name: str
    ) -> None:
        self.policy = policy
        self.publisher = publisher
        self.health = health
        self.ranks = ranks
        self.model_name = model_name

    def __call__(self, batch: Any, batch_idx: int, choose: Chooser) -> Tensor | None:
        """The loss Lightning runs backward on (None: every trial has stopped, or the step returned None).

        Args:
            batch: Lightning's batch.
            batch_idx: its index.
            choose: ``backend="auto"``'s chooser (:func:`lightning_hydro.backends.auto.choose_backend`); several
                processes take rank zero's choice.
        """
        group = self.policy.slots.group
        if not group.trial_ids:
            return None  # every trial has stopped (the module's on_train_batch_start skips such batches)
        backend = self.policy.for_training(
            lambda candidate: self.forward_backward(candidate, batch, batch_idx), choose, self.model_name
        )
        if self.policy.verify_ids:
            backend = self.policy.verify(backend, batch, batch_idx)
        out = self.policy.run_training(backend, batch, batch_idx)
        self.publisher.record_step("train", "training_step", out.logs, batch)
        loss = out.loss()
        if loss is None:
            return None
        loss = self.ranks.losses(loss.reshape(group.size))  # a row bad on any rank is skipped on all
        bad = self.health.record_losses(group.trial_ids, loss)  # stays on the device: no host sync
        return sum_of_finite(loss, bad)

    def forward_backward(self, backend: Backend, batch: Any, batch_idx: int) -> None:
        """One forward and backward of ``batch`` with a candidate backend (what ``backend="auto"`` times)."""
        loss = backend.run("training_step", batch, batch_idx).loss()
        if loss is not None:
            self.backward(sum_of_finite(loss, ~torch.isfinite(loss.detach())), backend.name)

    def backward(self, loss: Tensor, backend: str, *args: Any, **kwargs: Any) -> None:
        """``loss.backward``, a failure a fused backend causes explained (e.g. activation checkpointing)."""
        try:
            loss.backward(*args, **kwargs)
        except RuntimeError as err:  # e.g. activation checkpointing, which recomputes the forward outside vmap
            explained = explain_backward_error(err, backend=backend, module_name=self.model_name)
            if explained is None:
                raise
            raise explained from err
