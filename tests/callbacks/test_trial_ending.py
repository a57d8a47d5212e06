"""TrialEnding and the summary printed at the end of fit."""

from __future__ import annotations

from lightning_hydro.callbacks import TrialEnding, format_summary


def test_outcomes_round_trip_through_plain_values():
    outcome = TrialEnding("job3", "stopped", 3, "ASHA rung 1 (budget 3): ...", rung=1, bracket=None, value=0.5)
    assert TrialEnding.from_dict(outcome.as_dict()) == outcome


def test_summary_counts_statuses_and_rungs_and_reports_the_budget():
    outcomes = {
        0: TrialEnding(0, "stopped", 1, "r", rung=0),
        1: TrialEnding(1, "stopped", 1, "r", rung=0),
        2: TrialEnding(2, "stopped", 3, "r", rung=1),
        3: TrialEnding(3, "completed", 9, "reached max_t=9"),
    }
    budgets = {0: 1, 1: 1, 2: 3, 3: 9, 4: 2}
    text = format_summary("Hyperband", outcomes, budgets, max_t=9, time_attr="steps", statuses={4: "diverged"})
    assert text.splitlines() == [
        "Hyperband: 5 trials: 1 completed, 3 stopped (rung 0: 2, rung 1: 1), 1 diverged.",
        "Budget: 16 of 45 trial-steps (35.6%) against training every trial to max_t=9.",
    ]


def test_summary_of_one_running_trial():
    text = format_summary("ASHA", {}, {"a": 2}, max_t=4, time_attr="epochs")
    assert text.startswith("ASHA: 1 trial: 0 completed, 0 stopped, 1 running.")
