"""The one helper behind every module's deprecated names (``lightning_hydro._deprecation``)."""

import warnings

import pytest

from lightning_hydro._deprecation import Renamed, RenamedAttribute, renamed_names


def test_an_old_name_warns_with_the_fix_and_resolves_lazily():
    getattr_ = renamed_names("pkg.mod", {"Old": Renamed("collections:OrderedDict", "is renamed OrderedDict; use it")})
    with pytest.warns(DeprecationWarning, match=r"^pkg.mod.Old is renamed OrderedDict; use it. The old name will be"):
        resolved = getattr_("Old")
    from collections import OrderedDict

    assert resolved is OrderedDict


def test_the_warning_points_at_the_line_that_asked_for_the_old_name():
    getattr_ = renamed_names("pkg.mod", {"Old": Renamed("os:sep", "is now os.sep")})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr_("Old")
    assert caught[0].filename == __file__


def test_any_other_name_is_the_usual_attribute_error():
    getattr_ = renamed_names("pkg.mod", {})
    with pytest.raises(AttributeError, match=r"^module 'pkg.mod' has no attribute 'New'$"):
        getattr_("New")


def test_a_renamed_attribute_reads_the_new_one_with_a_warning():
    class Run:
        old = RenamedAttribute("new", "is renamed new; use .new")

        def __init__(self) -> None:
            self.new = [1]

    run = Run()
    with pytest.warns(DeprecationWarning, match=r"^Run.old is renamed new; use .new. The old name will be removed"):
        assert run.old is run.new
    assert isinstance(Run.old, RenamedAttribute)
