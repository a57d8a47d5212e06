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


@pytest.mark.parametrize(
    ("old", "new"), [("SuccessiveHalving", "SuccessiveHalvingRule"), ("Hyperband", "HyperbandRule")]
)
def test_old_rule_names_still_work_with_a_deprecation_warning(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"lightning_hydro.schedulers.{old} is renamed {new} .*import {new}"):
        rule = getattr(schedulers, old)
    assert rule is getattr(schedulers, new)
    missing = "Hyperbands"
    with pytest.raises(AttributeError, match=r"has no attribute 'Hyperbands'"):
        getattr(schedulers, missing)


def test_the_trial_vocabulary_is_one_set_of_names() -> None:
    trial_ending = importlib.import_module("lightning_hydro.callbacks.trial_ending")
    fused_module = importlib.import_module("lightning_hydro.fused.module")
    fit_trials = importlib.import_module("lightning_hydro.sweeper.fit_trials")

    assert fused_module.TrialStatus is schedulers.TrialStatus
    assert trial_ending.TrialStatus is schedulers.TrialStatus
    assert fit_trials.TrialStatus is schedulers.TrialStatus
    assert fit_trials.TrialResult is schedulers.TrialResult
