"""RowHealth: rows' finiteness and step counts kept on the device, read back on a schedule."""

from __future__ import annotations

import pytest
import torch

from lightning_hydro.fused.step.row_health import RowHealth
from lightning_hydro.optim.group_optimizer import StepReport


def _report(ids: list[int], loss: list[bool], grads: list[bool]) -> StepReport:
    return StepReport(tuple(ids), torch.tensor(loss), torch.tensor(grads))


def test_a_diverged_row_stays_skipped_until_read_back_and_is_reported_with_its_step():
    health = RowHealth(check_every=8)
    ids = [4, 5, 6]
    health.record_losses(ids, torch.tensor([1.0, float("inf"), 2.0]))
    assert health.rows_to_skip(ids).tolist() == [False, True, False]
    assert health.absorb(_report(ids, [False, True, False], [False, False, False]), step=1)  # step 1: read
    first = health.read()  # one step's masks are its counts
    assert first.diverged == {5: ("non-finite loss", 1)}
    assert first.steps == {4: 1, 5: 0, 6: 1}
    for step in range(2, 6):
        health.record_losses(ids, torch.tensor([1.0, 1.0, 2.0]))
        skip = health.rows_to_skip(ids)  # what the optimizer is told
        assert skip is not None
        grads_bad = torch.tensor([False, False, step == 3]) & ~skip
        due = health.absorb(StepReport(tuple(ids), skip, grads_bad), step=step)
        assert due == (step in (2, 4))
        if step == 2:
            health.read()
        if step == 3:  # trial 6 diverged at step 3: skipped from now on, whatever its loss
            health.record_losses(ids, torch.tensor([1.0, 1.0, 2.0]))
            assert health.rows_to_skip(ids).tolist() == [False, False, True]
    readback = health.read()
    assert readback.diverged == {6: ("non-finite gradients", 3)}
    assert readback.steps == {4: 3, 5: 3, 6: 0}


def test_the_schedule_ramps_up_then_reads_every_n_steps():
    health = RowHealth(check_every=8)
    ids = [0]
    due = [health.absorb(_report(ids, [False], [False]), step=n) for n in range(1, 25)]
    assert [n for n, d in zip(range(1, 25), due) if d] == [1, 2, 4, 8, 16, 24]


def test_rows_cannot_change_with_unread_records():
    health = RowHealth(check_every=8)
    health.absorb(_report([0, 1], [False, False], [False, False]), step=3)
    with pytest.raises(RuntimeError, match=r"rows changed from \[0, 1\] to \[0\] with unread records"):
        health.record_losses([0], torch.tensor([1.0]))


def test_check_every_must_be_positive():
    with pytest.raises(ValueError, match=r"divergence_check_every must be a positive number .* got 0"):
        RowHealth(check_every=0)


def test_a_loss_divergence_read_back_several_steps_later_keeps_its_reason_and_step():
    health = RowHealth(check_every=8)
    ids = [0, 1]
    for step in range(1, 5):  # read back at 1, 2 and 4 (the ramp); steps 5 to 7 are counted together
        if health.absorb(_report(ids, [False, False], [False, False]), step=step):
            health.read()
    for step in range(5, 8):
        losses = torch.tensor([1.0, float("nan") if step == 6 else 1.0])
        health.record_losses(ids, losses)
        skip = health.rows_to_skip(ids)
        assert skip is not None
        assert not health.absorb(StepReport(tuple(ids), skip, torch.tensor([False, False])), step=step)
    readback = health.read()
    assert readback.diverged == {1: ("non-finite loss", 6)}
    assert readback.steps == {0: 3, 1: 1}
    assert health.read().steps == {}  # forgotten


def test_a_step_may_read_its_masks_back_only_on_the_cpu_read_back_every_step():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert RowHealth().reads_each_step(cpu)  # the CPU's default: read back every step
    assert RowHealth(check_every=1).reads_each_step(cpu)
    assert not RowHealth(check_every=16).reads_each_step(cpu)  # as on a GPU: the steady steps read nothing
    assert not RowHealth().reads_each_step(cuda)
    assert not RowHealth(check_every=1).reads_each_step(cuda)  # a read there waits for the device
