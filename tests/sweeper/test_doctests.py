"""The examples in the sweeper's docstrings run."""

import doctest
import importlib

import pytest

MODULES = [
    "planning.search_space",
    "planning.samplers",
    "planning.trial_groups",
    "planning.fusion_limit",
    "planning.settings",
    "planning.reports",
    "planning.plots",
    "job.metric_history",
    "job.trainer_factory",
    "job.overrides",
    "job.group_model",
    "job.group_task",
    "planning.fusion_report",
    "planning.study_channel",
    "planning.sweep_search",
    "job.backend_cache",
    "planning.grouping",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"lightning_hydro.sweeper.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
