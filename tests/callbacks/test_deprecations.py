"""Names the callbacks package had in the previous release keep working, with a DeprecationWarning."""

import importlib

import pytest

import lightning_hydro.callbacks as callbacks
import lightning_hydro.stopping as stopping


@pytest.mark.parametrize(("old", "new"), [("OutcomeStatus", "TrialStatus"), ("TimeAttr", "TimeAttr")])
def test_moved_names_warn_and_resolve_to_the_core(old, new):
    assert old not in callbacks.__all__
    with pytest.warns(DeprecationWarning, match=rf"lightning_hydro.callbacks.{old} is now lightning_hydro.stopping"):
        assert getattr(callbacks, old) is getattr(stopping, new)


def test_an_unknown_name_is_an_attribute_error():
    missing = "Median"
    with pytest.raises(AttributeError, match=r"module 'lightning_hydro.callbacks' has no attribute 'Median'"):
        getattr(callbacks, missing)


def test_trial_outcome_is_trial_ending_with_a_warning():
    assert "TrialOutcome" not in callbacks.__all__
    with pytest.warns(DeprecationWarning, match=r"lightning_hydro.callbacks.TrialOutcome is renamed TrialEnding "):
        assert callbacks.TrialOutcome is callbacks.TrialEnding
    old_module = importlib.import_module("lightning_hydro.callbacks.trial_outcome")
    with pytest.warns(DeprecationWarning, match=r"trial_outcome.TrialOutcome is renamed .*trial_ending.TrialEnding"):
        assert old_module.TrialOutcome is callbacks.TrialEnding
    with pytest.warns(DeprecationWarning, match=r"trial_outcome.format_summary is now .*trial_ending.format_summary"):
        assert old_module.format_summary is callbacks.format_summary
    with pytest.raises(AttributeError, match=r"module 'lightning_hydro.callbacks.trial_outcome' has no attribute 'X'"):
        old_module.X  # noqa: B018


def test_the_outcomes_attribute_is_endings_with_a_warning():
    asha = callbacks.ASHA("val_loss", max_t=3)
    asha.endings[0] = callbacks.TrialEnding(0, "stopped", 1, "ASHA rung 0 (budget 1): ...", rung=0)
    with pytest.warns(DeprecationWarning, match=r"ASHA.outcomes is renamed endings .*use .endings"):
        assert asha.outcomes is asha.endings


def test_the_samplers_trial_outcome_is_sampler_feedback_with_a_warning():
    samplers = importlib.import_module("lightning_hydro.sweeper.planning.samplers")
    assert "TrialOutcome" not in samplers.__all__
    with pytest.warns(DeprecationWarning, match=r"samplers.TrialOutcome is renamed SamplerFeedback .*import Sampler"):
        assert samplers.TrialOutcome is samplers.SamplerFeedback
