"""TrialRoster: trials leave and join a group with every part kept in step, without a Trainer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lightning_hydro.demos import DigitsMLP
from lightning_hydro.fused.evaluation.modes import TrialModes
from lightning_hydro.fused.group.slots import TrialSlots
from lightning_hydro.fused.logging.metrics import TrialMetrics
from lightning_hydro.fused.optimization import TrialOptimizers
from lightning_hydro.fused.roster import TrialRoster
from lightning_hydro.fused.step.backend_policy import BackendPolicy
from lightning_hydro.fused.step.row_health import RowHealth
from lightning_hydro.optim.group_optimizer import StepReport


def _roster(size: int = 3, max_slots: int = 3) -> TrialRoster:
    owner = nn.Module()
    slots = TrialSlots(owner, [DigitsMLP(hidden_dim=8) for _ in range(size)], list(range(size)), max_slots)
    policy = BackendPolicy("vmap", slots, verify=True, deterministic=True)
    optimizers = TrialOptimizers(slots, path="universal")
    optimizers.configure()
    return TrialRoster(policy, optimizers, TrialMetrics(), RowHealth(check_every=4), TrialModes())


def test_a_diverged_row_found_at_a_read_back_leaves_as_diverged_and_the_others_count_their_steps():
    roster = _roster()
    bad = torch.tensor([False, True, False])
    report = StepReport((0, 1, 2), skipped_loss=bad, skipped_gradients=torch.zeros(3, dtype=torch.bool))
    assert roster.health.absorb(report, 1)  # step 1 of the 1, 2, 4 ramp: read back now
    assert roster.health.end_batch(last=False) == (True, True)  # stepped in the batch; read back at its end
    assert roster.health.end_batch(last=False) == (False, False)  # the next batch: nothing yet
    roster.slots.book.start_epoch([0, 1, 2])
    trainer = SimpleNamespace(global_step=5, strategy=SimpleNamespace(lr_scheduler_configs=[]))  # at step 5
    roster.settle_health(trainer, credit_epoch=True)  # type: ignore[arg-type]
    assert roster.slots.trial_ids == [0, 2]
    book = roster.slots.book.records
    assert (book[1].status, book[1].reason) == ("diverged", "non-finite loss")
    assert (book[0].steps, book[2].steps, book[1].steps) == (1, 1, 0)
    assert (book[0].epochs, book[1].epochs) == (1, 0)  # diverged at step 1 of 5: it did not train through the epoch
    assert set(roster.optimizers.optimizer.trials) == {0, 2}  # type: ignore[union-attr]


def test_stop_and_add_keep_the_optimizer_the_policy_and_the_health_in_step():
    roster = _roster(size=2, max_slots=2)
    roster.stop(None, 0, "a decision", status="stopped")
    assert roster.slots.trial_ids == [1]
    assert 0 not in roster.policy.verify_ids
    tid = roster.add(None, nn.Module(), DigitsMLP(hidden_dim=8), None)
    assert tid == 2
    assert roster.slots.trial_ids == [1, 2]
    assert set(roster.optimizers.optimizer.trials) == {1, 2}  # type: ignore[union-attr]
    assert 2 in roster.policy.verify_ids  # the newcomer is checked on its first fused batch
    roster.health.record_losses([1, 2], torch.tensor([0.1, 0.2]))  # the health follows the new rows


def test_add_refuses_what_cannot_join():
    roster = _roster(size=2, max_slots=2)
    with pytest.raises(TypeError, match=r"add_trial: expected a lightning.LightningModule, got Linear"):
        roster.add(None, nn.Module(), nn.Linear(2, 2), None)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match=r"add_trial: all 2 slots are taken; stop a trial first"):
        roster.add(None, nn.Module(), DigitsMLP(hidden_dim=8), None)
    with pytest.raises(KeyError, match=r"stop_trial: trial 7 is not running; running trials: \[0, 1\]"):
        roster.stop(None, 7, "", status="stopped")
