"""Hyperband in a real Trainer: trials dealt to brackets, each bracket judged on its own rungs."""

from __future__ import annotations

import pytest

from lightning_hydro.callbacks import Hyperband
from lightning_hydro.stopping import HalvingConfig, HyperbandRule
from tests.callbacks.trials import LEARNING_RATES, fit, fused, mlp, val_losses


def test_fused_trials_are_dealt_to_brackets_and_judged_there():
    module = fused(LEARNING_RATES)
    callback = Hyperband("val_loss", grace_period=1, reduction_factor=3, max_t=3)
    fit(module, [callback], max_epochs=3)

    # brackets for max_t=3, eta=3: s=1 starts 3 trials at rung 1; s=0 starts 2 trials judged only at 3
    assert [(b.s, b.trials) for b in callback.rule.brackets] == [(1, 3), (0, 2)]
    assignments = callback.rule.assignments
    assert assignments == {0: 1, 1: 1, 2: 1, 3: 0, 4: 0, 5: 1, 6: 1, 7: 1, 8: 0}  # the paper's order, cycling

    reference = HyperbandRule(HalvingConfig("min", 1, 3, 3))
    for tid in range(9):
        reference.add_trial(tid)
    decisions = reference.report_batch([(tid, 1, val_losses(module, tid)[0]) for tid in range(9)])
    cut = {d.trial_id for d in decisions if d.action == "stop"}
    assert len(cut) == 4  # bracket 1 keeps ceil(6/3) = 2 of its 6 trials; bracket 0 is not judged at 1
    for tid, result in module.results.items():
        if tid in cut:
            assert (result["status"], result["epochs"]) == ("stopped", 1)
            assert result["reason"].startswith("Hyperband bracket 1 rung 0 (budget 1): val_loss")
        else:
            assert (result["status"], result["epochs"]) == ("completed", 3)
    assert callback.budget.spent == 4 * 1 + 5 * 3


def test_one_trial_per_process_needs_its_position(tmp_path):
    callback = Hyperband("val_loss", max_t=3, storage=str(tmp_path / "hb.db"), trial_id="job-a")
    with pytest.raises(ValueError, match=r"Hyperband: with one trial per process, each process needs its place in"):
        fit(mlp(0.1), [callback], max_epochs=3)
    with pytest.raises(ValueError, match=r"Hyperband: position must be an integer >= 0 .*got -1"):
        Hyperband("val_loss", position=-1)
    with pytest.raises(ValueError, match=r"Hyperband: order must be 'sequential' or 'interleaved', got 'random'"):
        Hyperband("val_loss", order="random")


def test_one_trial_per_process_joins_the_bracket_of_its_position(tmp_path):
    storage = str(tmp_path / "hb.db")
    # positions 0..2 go to bracket 1 (judged at epoch 1), 3 and 4 to bracket 0 (judged only at max_t)
    runs = [(0, 0.3), (1, 0.2), (3, 0.0001), (2, 0.0001)]
    callbacks = []
    for position, lr in runs:
        callback = Hyperband("val_loss", max_t=3, storage=storage, trial_id=f"job{position}", position=position)
        fit(mlp(lr), [callback], max_epochs=3)
        callbacks.append(callback)
    assert [callback.rule.assignments[f"job{p}"] for callback, (p, _) in zip(callbacks, runs)] == [1, 1, 0, 1]
    bracket_zero, last = callbacks[2], callbacks[3]
    assert bracket_zero.status == "completed"  # a hopeless trial in bracket 0 still trains to max_t
    assert last.status == "stopped"
    assert last.result["reason"].startswith("Hyperband bracket 1 rung 0")
