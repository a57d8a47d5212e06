"""Every example in the hfta docstrings runs and shows what it claims."""

import doctest
import importlib
import pkgutil

import pytest

import lightning_hydro.backends.hfta as hfta

MODULES = sorted(info.name for info in pkgutil.iter_modules(hfta.__path__, f"{hfta.__name__}."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
