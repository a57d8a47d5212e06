"""``lightning_hydro.schedulers`` (the package's name up to 0.1.0) resolves every old import path, with a warning."""

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import lightning_hydro.schedulers as schedulers
import lightning_hydro.stopping as stopping

NEW_MODULES = sorted(m.name for m in pkgutil.iter_modules(stopping.__path__) if not m.name.startswith("_"))


def defined_names(module: str) -> list[str]:
    """The public names a module defines at its top level (what a user could import from it)."""
    tree = ast.parse(Path(importlib.import_module(module).__file__ or "").read_text())
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [target.id for target in node.targets if isinstance(target, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return sorted(name for name in names if not name.startswith("_") and name != "T")


def test_every_module_of_the_new_package_has_its_old_path():
    old = sorted(m.name for m in pkgutil.iter_modules(schedulers.__path__) if not m.name.startswith("_"))
    assert old == NEW_MODULES


@pytest.mark.parametrize("name", stopping.__all__)
def test_the_old_package_resolves_each_public_name(name):
    with pytest.warns(
        DeprecationWarning, match=rf"^lightning_hydro.schedulers.{name} moved to lightning_hydro.stopping.{name} "
    ):
        assert getattr(schedulers, name) is getattr(stopping, name)


@pytest.mark.parametrize("module", NEW_MODULES)
def test_each_old_module_resolves_every_name_of_its_new_module(module):
    old = importlib.import_module(f"lightning_hydro.schedulers.{module}")
    new = importlib.import_module(f"lightning_hydro.stopping.{module}")
    for name in defined_names(new.__name__):
        with pytest.warns(DeprecationWarning, match=rf"schedulers.{module}.{name} moved to {new.__name__}.{name} "):
            assert getattr(old, name) is getattr(new, name)


def test_an_old_import_statement_warns_with_the_removal_version():
    with pytest.warns(DeprecationWarning, match=r"import it from there. The old name will be removed in \d+\.\d+\.0"):
        from lightning_hydro.schedulers.hyperband import bracket_for_position
    from lightning_hydro.stopping.hyperband import bracket_for_position as new

    assert bracket_for_position is new


@pytest.mark.parametrize(
    ("old", "new"), [("SuccessiveHalving", "SuccessiveHalvingRule"), ("Hyperband", "HyperbandRule")]
)
def test_old_rule_names_still_work_with_a_deprecation_warning(old, new):
    with pytest.warns(
        DeprecationWarning, match=rf"lightning_hydro.schedulers.{old} is renamed {new} .*lightning_hydro.stopping.{new}"
    ):
        rule = getattr(schedulers, old)
    assert rule is getattr(stopping, new)
    assert not hasattr(stopping, old)


def test_any_other_name_is_the_usual_attribute_error():
    missing = "Hyperbands"
    with pytest.raises(AttributeError, match=r"has no attribute 'Hyperbands'"):
        getattr(schedulers, missing)
    with pytest.raises(ImportError, match=r"cannot import name 'Hyperbands'"):
        exec("from lightning_hydro.schedulers.hyperband import Hyperbands")


def test_open_store_stays_the_function_after_its_old_module_is_imported():
    importlib.import_module("lightning_hydro.schedulers.open_store")
    with pytest.warns(DeprecationWarning, match=r"^lightning_hydro.schedulers.open_store moved to"):
        from lightning_hydro.schedulers import open_store
    assert open_store is stopping.open_store
