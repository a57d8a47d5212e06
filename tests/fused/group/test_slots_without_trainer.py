"""TrialSlots without a Trainer: stop and add keep rows, records and optimizer state describing the same trials."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_hydro.demos import DigitsMLP
from lightning_hydro.fused.group.slots import TrialSlots
from lightning_hydro.fused.step.select_update import select_fused_update
from lightning_hydro.optim.group_optimizer import TrialGroupOptimizer
from lightning_hydro.optim.optimizer_config import parse_optimizer_config


def _slots(n: int = 3, optimizer: str = "adam") -> TrialSlots:
    torch.manual_seed(0)
    trials = [DigitsMLP(hidden_dim=8, lr=0.01 * (i + 1), optimizer=optimizer) for i in range(n)]
    slots = TrialSlots(nn.Module(), trials, list(range(n)), max_slots=n)
    optimizations = {
        tid: parse_optimizer_config(m.configure_optimizers(), trial_id=tid, module=m) for tid, m in slots.running()
    }
    slots.optimizer = TrialGroupOptimizer(slots.group, optimizations, fast_path=select_fused_update)
    return slots


def _step(slots: TrialSlots) -> None:
    for param in slots.group.params.values():
        param.grad = torch.randn_like(param)
    slots.optimizer.step()  # type: ignore[union-attr]


def test_stop_compacts_rows_and_survivors_keep_their_optimizer_state():
    slots = _slots()
    _step(slots)
    assert slots.optimizer is not None
    assert slots.optimizer.active_path == "fused"
    slots.optimizer.materialize()
    before = {
        tid: [s["exp_avg"].clone() for s in slots.optimizer.trials[tid].optimizer.state.values()] for tid in (0, 2)
    }
    slots.optimizer.rebuild()
    retired = slots.stop(1, "stopped", "a decision")
    assert slots.trial_ids == [0, 2]
    assert slots.free == 1
    assert slots.group.params["head.weight"].shape[0] == 2
    assert slots.module(1) is retired
    assert slots.book.records[1].status == "stopped"
    assert sorted(slots.optimizer.trials) == [0, 2]
    slots.optimizer.materialize()
    for tid in (0, 2):
        after = [s["exp_avg"] for s in slots.optimizer.trials[tid].optimizer.state.values()]
        assert all(torch.equal(a, b) for a, b in zip(before[tid], after))


def test_add_fills_a_free_slot_with_fresh_optimizer_state():
    slots = _slots()
    _step(slots)
    slots.stop(0, "stopped", "")
    newcomer = DigitsMLP(hidden_dim=8, lr=0.5, optimizer="adam")
    optimization = parse_optimizer_config(newcomer.configure_optimizers(), trial_id=3, module=newcomer)
    assert slots.add(newcomer, None, optimization) == 3
    assert slots.trial_ids == [1, 2, 3]
    assert slots.free == 0
    assert slots.optimizer is not None
    slots.optimizer.materialize()
    assert not slots.optimizer.trials[3].optimizer.state  # fresh
    assert slots.optimizer.trials[1].optimizer.state  # kept


def test_slot_errors_say_what_came_and_what_to_do():
    slots = _slots()
    with pytest.raises(KeyError, match=r"trial 7 is not running; running trials: \[0, 1, 2\]"):
        slots.stop(7, "stopped", "")
    with pytest.raises(ValueError, match=r"status must be 'stopped', 'completed' or 'diverged', got 'running'"):
        slots.stop(0, "running", "")
    with pytest.raises(RuntimeError, match=r"all 3 slots are taken; stop a trial first"):
        slots.add(DigitsMLP(hidden_dim=8), None)
    slots.stop(0, "stopped", "")
    with pytest.raises(ValueError, match=r"trial id 1 is already used"):
        slots.add(DigitsMLP(hidden_dim=8), 1)
