"""The one helper behind every module's deprecated names (``lightning_hydro._deprecation``)."""

import subprocess
import sys
import warnings

import pytest
from packaging.version import Version

import lightning_hydro
from lightning_hydro._deprecation import Renamed, RenamedAttribute, next_minor, removal_version, renamed_names

# The removal version, worked out here independently of the helper: the minor release after this one.
_RELEASE = Version(lightning_hydro.__version__).release
REMOVED_IN = f"{_RELEASE[0]}.{_RELEASE[1] + 1}.0"


def test_an_old_name_warns_with_the_fix_and_resolves_lazily():
    getattr_ = renamed_names("pkg.mod", {"Old": Renamed("collections:OrderedDict", "is renamed OrderedDict; use it")})
    with pytest.warns(
        DeprecationWarning,
        match=rf"^pkg.mod.Old is renamed OrderedDict; use it. The old name will be removed in {REMOVED_IN}.$",
    ):
        resolved = getattr_("Old")
    from collections import OrderedDict

    assert resolved is OrderedDict


def test_the_warning_points_at_the_line_that_asked_for_the_old_name():
    getattr_ = renamed_names("pkg.mod", {"Old": Renamed("os:sep", "is now os.sep")})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr_("Old")
    assert caught[0].filename == __file__


def test_a_lazy_name_is_imported_when_first_asked_for_without_a_warning():
    getattr_ = renamed_names("pkg.mod", {}, lazy={"OrderedDict": "collections"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolved = getattr_("OrderedDict")
    from collections import OrderedDict

    assert resolved is OrderedDict
    with pytest.raises(AttributeError, match=r"^module 'pkg.mod' has no attribute 'deque'$"):
        getattr_("deque")  # only the names listed


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
    with pytest.warns(
        DeprecationWarning, match=rf"^Run.old is renamed new; use .new. The old name will be removed in {REMOVED_IN}.$"
    ):
        assert run.old is run.new
    assert isinstance(Run.old, RenamedAttribute)


def test_the_removal_version_is_the_minor_release_after_this_one():
    assert removal_version() == REMOVED_IN


@pytest.mark.parametrize(
    ("version", "expected"),
    [("0.1.0", "0.2.0"), ("0.5.2", "0.6.0"), ("0.9.0", "0.10.0"), ("1.0.0rc1", "1.1.0"), ("2.3", "2.4.0")],
)
def test_next_minor(version, expected):
    assert next_minor(version) == expected


def test_next_minor_refuses_a_version_without_major_and_minor():
    with pytest.raises(ValueError, match=r"^next_minor: expected a version that starts with 'major.minor'.*got 'dev'$"):
        next_minor("dev")


def test_the_helper_loads_nothing_else_of_ours_even_when_it_warns():
    code = (
        "import sys, warnings\n"
        "from lightning_hydro._deprecation import Renamed, renamed_names\n"
        "warnings.simplefilter('ignore')\n"
        "renamed_names('m', {'Old': Renamed('os:sep', 'is now os.sep')})('Old')\n"
        "print(sorted(name for name in sys.modules if name.startswith('lightning_hydro')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "['lightning_hydro', 'lightning_hydro._deprecation']"
