"""The package as a whole: its docstring examples run, and it needs neither torch nor Lightning."""

import doctest
import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

import lightning_hydro.stopping as stopping

MODULES = sorted(module.name for module in pkgutil.iter_modules(stopping.__path__))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(f"{stopping.__name__}.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_every_public_class_and_function_has_a_docstring() -> None:
    public = [getattr(stopping, name) for name in stopping.__all__]
    undocumented = [
        obj.__name__ for obj in public if (inspect.isclass(obj) or inspect.isfunction(obj)) and not obj.__doc__
    ]
    assert undocumented == []


def test_importing_needs_no_torch_lightning_or_sqlalchemy() -> None:
    code = (
        "import sys, lightning_hydro.stopping; "
        "print(sorted(m for m in ('torch', 'lightning', 'sqlalchemy', 'numpy') if m in sys.modules))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"


def test_the_trial_vocabulary_is_one_set_of_names() -> None:
    trial_ending = importlib.import_module("lightning_hydro.callbacks.trial_ending")
    fused_module = importlib.import_module("lightning_hydro.fused.module")
    fit_trials = importlib.import_module("lightning_hydro.sweeper.job.fit_trials")

    assert fused_module.TrialStatus is stopping.TrialStatus
    assert trial_ending.TrialStatus is stopping.TrialStatus
    assert fit_trials.TrialStatus is stopping.TrialStatus
    assert fit_trials.TrialResult is stopping.TrialResult
