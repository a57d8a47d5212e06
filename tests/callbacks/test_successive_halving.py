"""SuccessiveHalving in a real Trainer: the group really shrinks, the cuts are the rule's, budgets add up."""

from __future__ import annotations

import pytest

from lightning_hydro.callbacks import SuccessiveHalving
from lightning_hydro.stopping import HalvingConfig, SuccessiveHalvingRule, successive_halving_budget
from tests.callbacks.trials import LEARNING_RATES, GroupProbe, fit, fused, mlp, val_losses


def test_nine_trials_are_cut_to_three_and_the_stacked_state_shrinks():
    module, probe = fused(LEARNING_RATES), GroupProbe()
    callback = SuccessiveHalving("val_loss", mode="min", grace_period=1, reduction_factor=3, max_t=3)
    fit(module, [callback, probe], max_epochs=3)

    # the reference: the pure rule on the values the trials logged at the first rung
    rule = SuccessiveHalvingRule(HalvingConfig("min", 1, 3, 3))
    first_rung = rule.report_rung({tid: val_losses(module, tid)[0] for tid in range(9)}, budget=1)
    survivors = sorted(tid for tid, decision in first_rung.items() if decision.action == "continue")
    assert len(survivors) == 3
    assert probe.trial_ids == [list(range(9)), survivors, survivors]
    assert probe.rows == [9, 3, 3]  # later steps really run on 3 trials

    for tid, result in module.results.items():
        if tid in survivors:
            assert (result["status"], result["epochs"], result["reason"]) == ("completed", 3, "reached max_t=3")
        else:
            assert (result["status"], result["epochs"]) == ("stopped", 1)
            assert result["reason"].startswith("SuccessiveHalving rung 0 (budget 1): val_loss ")
            assert callback.endings[tid].rung == 0
    expected = successive_halving_budget(9, callback.config)
    assert (callback.budget.spent, callback.budget.exhaustive) == (expected.spent, 27) == (15, 27)
    assert module.trial_ids == []  # every trial ended: completed at max_t or stopped
    assert "SuccessiveHalving: 9 trials: 3 completed, 6 stopped (rung 0: 6)." in callback.summary
    assert "Budget: 15 of 27 trial-epochs (55.6%) against training every trial to max_t=3." in callback.summary


def test_the_summary_is_logged_at_the_end_of_fit(caplog):
    with caplog.at_level("INFO", logger="lightning.pytorch.utilities.rank_zero"):
        fit(fused(LEARNING_RATES[:3]), [SuccessiveHalving("val_acc", mode="max", max_t=2)], max_epochs=2)
    assert "SuccessiveHalving: 3 trials: 1 completed, 2 stopped (rung 0: 2)." in caplog.text
    assert "Budget: 4 of 6 trial-epochs (66.7%)" in caplog.text


def test_budgets_in_steps():
    module = fused(LEARNING_RATES[:4])
    callback = SuccessiveHalving("val_loss", time_attr="steps", grace_period=3, reduction_factor=2, max_t=6)
    fit(module, [callback], max_epochs=2)  # 3 steps per epoch: rungs at 3 and 6 steps
    assert sorted(r["steps"] for r in module.results.values()) == [3, 3, 6, 6]
    assert sorted(r["status"] for r in module.results.values()) == ["completed", "completed", "stopped", "stopped"]
    assert "Budget: 18 of 24 trial-steps" in callback.summary


def test_floor_rounding_keeps_fewer():
    module = fused(LEARNING_RATES[:5])
    fit(module, [SuccessiveHalving("val_loss", reduction_factor=2, max_t=2, rounding="floor")], max_epochs=2)
    assert [r["status"] for r in module.results.values()].count("completed") == 2  # floor(5/2), not ceil


def test_needs_a_fused_module():
    with pytest.raises(
        ValueError,
        match=r"SuccessiveHalving needs a FusedLightningModule .*got a DigitsMLP\. For one trial per process",
    ):
        fit(mlp(0.1), [SuccessiveHalving("val_loss", max_t=2)], max_epochs=2)


def test_rounding_is_checked():
    with pytest.raises(ValueError, match=r"SuccessiveHalving: rounding must be 'ceil' or 'floor', got 'round'"):
        SuccessiveHalving("val_loss", rounding="round")
