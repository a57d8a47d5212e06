"""The cheap re-reads of the trials' settings and modes: each answers as the full walk would, structure changes too."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from torch import nn

from lightning_hydro.backends.trial_attributes import differing_modes
from lightning_hydro.backends.trial_readers import ModesReader, SettingsReader, same_settings


def _trials() -> list[nn.Module]:
    return [
        nn.Sequential(nn.Linear(2, 4), nn.Sequential(nn.Dropout(0.1), nn.ReLU()), nn.Linear(4, 2)) for _ in range(3)
    ]


def test_the_settings_reader_sees_a_setting_changed_in_place_and_one_of_a_replaced_submodule():
    trials = _trials()
    reader = SettingsReader(trials)
    before = reader.read(trials)
    assert same_settings(before, reader.read(trials))
    trials[1][1][0].p = 0.3  # a dropout schedule, in place
    assert not same_settings(before, reader.read(trials))
    trials[1][1][0].p = 0.1
    assert same_settings(before, reader.read(trials))
    trials[2][1][0] = nn.Dropout(0.3)  # the same schedule written as a new module
    assert not same_settings(before, reader.read(trials))
    trials[2][1] = nn.Sequential(nn.Dropout(0.1), nn.ReLU())  # a new parent, the same values
    assert same_settings(before, reader.read(trials))
    del trials[0][0].in_features  # a setting the trial's code deleted reads as missing
    assert not same_settings(before, reader.read(trials))


CHANGES: dict[str, Callable[[list[nn.Module]], None]] = {
    "nothing": lambda t: None,
    "a submodule in eval mode": lambda t: t[1][1][0].eval(),
    "a trial in eval mode": lambda t: t[2].eval(),
    "every trial in eval mode": lambda t: [m.eval() for m in t],
    "a replaced submodule in eval mode": lambda t: t[1][1].__setitem__(1, nn.ReLU().eval()),
    "a replaced submodule in train mode": lambda t: t[1][1].__setitem__(1, nn.ReLU()),
    "an added submodule in eval mode": lambda t: t[0][1].append(nn.Identity().eval()),
    "a replaced parent in eval mode": lambda t: t[2].__setitem__(1, nn.Sequential(nn.Dropout(0.1)).eval()),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_the_modes_reader_answers_as_the_full_walk_after_each_change(change: str):
    trials = _trials()
    reader = ModesReader()
    assert reader.differing(trials) == []
    CHANGES[change](trials)
    assert reader.differing(trials) == differing_modes(trials)
    for module in trials:  # and back: every mode alike again
        module.train()
    assert reader.differing(trials) == differing_modes(trials) == []


def test_the_modes_reader_of_no_trials_says_nothing_differs():
    assert ModesReader().differing([]) == []
