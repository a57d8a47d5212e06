"""RefillSource: draws new trials from an iterable or a factory, and resumes where a previous run stopped."""

from __future__ import annotations

import pytest

from lightning_hydro.callbacks import RefillSource
from lightning_hydro.demos import DigitsMLP


def lrs(source: RefillSource) -> list[float]:
    drawn = []
    while (module := source.draw()) is not None:
        drawn.append(module.hparams["lr"])
    return drawn


def test_a_list_is_drawn_in_order_and_resumed_past_what_was_drawn():
    space = [DigitsMLP(lr=lr) for lr in (0.1, 0.2, 0.3)]
    source = RefillSource(space, owner="ASHA")
    assert source.draw().hparams["lr"] == 0.1
    resumed = RefillSource(space, owner="ASHA")
    resumed.load_state_dict(source.state_dict())
    assert lrs(resumed) == [0.2, 0.3]
    assert resumed.state_dict() == {"drawn": 3, "exhausted": True}
    assert resumed.draw() is None


def test_a_fresh_generator_passed_at_resume_is_advanced_the_same_way():
    def space():
        yield from (DigitsMLP(lr=lr) for lr in (0.1, 0.2, 0.3))

    resumed = RefillSource(space(), owner="ASHA")
    resumed.load_state_dict({"drawn": 2, "exhausted": False})
    assert lrs(resumed) == [0.3]
    shorter = RefillSource(space(), owner="ASHA")
    shorter.load_state_dict({"drawn": 5, "exhausted": False})
    assert shorter.exhausted


def test_factories_with_and_without_an_index():
    by_index = RefillSource(lambda index: DigitsMLP(lr=index + 1.0) if index < 2 else None, owner="ASHA")
    assert lrs(by_index) == [1.0, 2.0]
    counter = iter([0.5, 0.6])
    no_argument = RefillSource(lambda: DigitsMLP(lr=next(counter)) if True else None, owner="ASHA")
    assert no_argument.draw().hparams["lr"] == 0.5
    assert no_argument.draw().hparams["lr"] == 0.6


def test_bad_sources_and_bad_trials_are_explained():
    with pytest.raises(TypeError, match=r"ASHA: refill must be an iterable of LightningModules .*got int\. Wrap a"):
        RefillSource(3, owner="ASHA")
    with pytest.raises(TypeError, match=r"ASHA: refill must be .*got DigitsMLP\. Wrap a single module in a list"):
        RefillSource(DigitsMLP(), owner="ASHA")
    source = RefillSource([{"lr": 0.1}], owner="Hyperband")
    with pytest.raises(TypeError, match=r"Hyperband: refill produced a dict for new trial 0, expected a Lightning"):
        source.draw()
