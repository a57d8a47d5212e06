"""The package as a whole: its docstring examples run, and it needs neither torch nor Lightning."""

import doctest
import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

import lightning_hydro.schedulers as schedulers

MODULES = sorted(module.name for module in pkgutil.iter_modules(schedulers.__path__))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(f"{schedulers.__name__}.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_every_public_class_and_function_has_a_docstring() -> None:
    public = [getattr(schedulers, name) for name in schedulers.__all__]
    undocumented = [
        obj.__name__ for obj in public if (inspect.isclass(obj) or inspect.isfunction(obj)) and not obj.__doc__
    ]
    assert undocumented == []


def test_importing_needs_no_torch_lightning_or_sqlalchemy() -> None:
    code = (
        "import sys, lightning_hydro.schedulers; "
        "print(sorted(m for m in ('torch', 'lightning', 'sqlalchemy', 'numpy') if m in sys.modules))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"
