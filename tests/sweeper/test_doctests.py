"""The examples in the sweeper's docstrings run."""

import doctest
import importlib

import pytest

MODULES = [
    "search_space",
    "samplers",
    "trial_groups",
    "fusion_limit",
    "settings",
    "reports",
    "plots",
    "metric_history",
    "trainer_factory",
    "overrides",
    "group_model",
    "group_task",
    "fusion_report",
    "study_channel",
    "sweep_search",
    "backend_cache",
    "width_partitions",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"lightning_hydro.sweeper.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
