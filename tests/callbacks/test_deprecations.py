"""Names the callbacks package had in the previous release keep working, with a DeprecationWarning."""

import pytest

import lightning_hydro.callbacks as callbacks
import lightning_hydro.schedulers as schedulers


@pytest.mark.parametrize(("old", "new"), [("OutcomeStatus", "TrialStatus"), ("TimeAttr", "TimeAttr")])
def test_moved_names_warn_and_resolve_to_the_core(old, new):
    assert old not in callbacks.__all__
    with pytest.warns(DeprecationWarning, match=rf"lightning_hydro.callbacks.{old} is now lightning_hydro.schedulers"):
        assert getattr(callbacks, old) is getattr(schedulers, new)


def test_an_unknown_name_is_an_attribute_error():
    missing = "Median"
    with pytest.raises(AttributeError, match=r"module 'lightning_hydro.callbacks' has no attribute 'Median'"):
        getattr(callbacks, missing)
