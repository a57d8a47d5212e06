import pytest

from lightning_hydro.stopping import HalvingConfig, successive_halving_budget, summarize_budget


def test_27_trials_eta_3_spend_63_of_243_trial_epochs() -> None:
    budget = successive_halving_budget(27, HalvingConfig("max", grace_period=1, reduction_factor=3, max_t=9))
    assert budget.milestones == (1, 3, 9)
    assert budget.trials_per_rung == (27, 9, 3)
    assert budget.finishers == 3
    assert budget.spent == 27 * 1 + 9 * 2 + 3 * 6 == 63
    assert budget.exhaustive == 243
    assert budget.fraction == pytest.approx(63 / 243)


def test_survivors_of_a_top_rung_below_max_t_train_on_to_max_t() -> None:
    # milestones 1, 3, 9; max_t 10: 27 -> 9 -> 3 -> 1 trains from 9 to 10.
    budget = successive_halving_budget(27, HalvingConfig("max", 1, 3, 10))
    assert (budget.trials_per_rung, budget.finishers) == ((27, 9, 3), 1)
    assert budget.spent == 27 + 9 * 2 + 3 * 6 + 1 * 1


def test_rounding_changes_what_odd_cohorts_spend() -> None:
    config = HalvingConfig("min", 1, 3, 9)
    assert successive_halving_budget(10, config).trials_per_rung == (10, 4, 2)
    assert successive_halving_budget(10, config, rounding="floor").trials_per_rung == (10, 3, 1)
    assert successive_halving_budget(0, config).spent == 0


def test_n_trials_must_be_a_non_negative_integer() -> None:
    with pytest.raises(ValueError, match=r"n_trials must be an integer >= 0, got -1"):
        successive_halving_budget(-1, HalvingConfig("min", 1, 3, 9))


def test_summarize_budget() -> None:
    summary = summarize_budget({}, max_t=9)
    assert (summary.spent, summary.exhaustive, summary.fraction) == (0, 0, 0.0)
