"""The package as a whole: exports, docstrings, and docstring examples that really train."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil

import pytest

import lightning_hydro.callbacks as callbacks

MODULES = sorted(module.name for module in pkgutil.iter_modules(callbacks.__path__))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(f"{callbacks.__name__}.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_every_public_object_is_exported_and_documented():
    assert sorted(callbacks.__all__) == callbacks.__all__
    for name in callbacks.__all__:
        obj = getattr(callbacks, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, name


def test_every_hook_is_marked_override():
    from lightning.pytorch.callbacks import Callback

    hooks = {name for name, value in vars(Callback).items() if callable(value) and not name.startswith("_")}
    for cls in (callbacks.HalvingCallback, callbacks.Deadline):
        for name, value in vars(cls).items():
            if name in hooks:
                assert getattr(value, "__override__", False), f"{cls.__name__}.{name}"
