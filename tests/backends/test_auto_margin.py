"""backend='auto' keeps a margin: timing noise between near-equal backends does not flip its choice."""

import types

import pytest
from torch import nn

from lightning_hydro.backends import auto
from lightning_hydro.backends.auto import choose_backend
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.stacking.stacked_state import StackedState


class _Named:
    def __init__(self, name):
        self.name = name


def choose_with_step_times(monkeypatch, seconds, margin):
    """Choose between candidates whose steps take ``seconds[name]`` on a fake clock."""
    clock = {"now": 0.0, "running": None}

    def perf_counter():
        return clock["now"]

    monkeypatch.setattr(auto, "time", types.SimpleNamespace(perf_counter=perf_counter))
    auto.clear_backend_cache()
    group = StackedState(nn.Module(), [DigitsMLP(hidden_dim=8), DigitsMLP(hidden_dim=8)], [0, 1])

    def run_step(backend):
        clock["now"] += seconds[backend.name]

    candidates = [(name, lambda name=name: _Named(name)) for name in seconds]
    try:
        return choose_backend(group, candidates, run_step, margin=margin).backend.name
    finally:
        auto.clear_backend_cache()


@pytest.mark.parametrize(
    ("seconds", "margin", "chosen"),
    [
        ({"vmap": 0.0105, "loop": 0.0100}, 0.1, "vmap"),  # 5% apart: noise, the preferred one stays
        ({"vmap": 0.0105, "loop": 0.0100}, 0.0, "loop"),  # no margin: the fastest, however close
        ({"vmap": 0.0150, "loop": 0.0100}, 0.1, "loop"),  # clearly faster: chosen
    ],
)
def test_a_later_backend_must_be_clearly_faster(monkeypatch, seconds, margin, chosen):
    assert choose_with_step_times(monkeypatch, seconds, margin) == chosen


def choice_with_step_times(monkeypatch, seconds, margin, cores=1):
    clock = {"now": 0.0}
    monkeypatch.setattr(auto, "_cores", lambda device: cores)
    monkeypatch.setattr(auto, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))
    auto.clear_backend_cache()
    group = StackedState(nn.Module(), [DigitsMLP(hidden_dim=8), DigitsMLP(hidden_dim=8)], [0, 1])

    def run_step(backend):
        clock["now"] += seconds[backend.name]

    candidates = [(name, lambda name=name: _Named(name)) for name in seconds]
    try:
        return choose_backend(group, candidates, run_step, margin=margin)
    finally:
        auto.clear_backend_cache()


def test_the_report_states_the_margin_when_a_slower_backend_wins(monkeypatch):
    # the case: hfta first in order, 7.6% slower than vmap, kept by the margin
    choice = choice_with_step_times(monkeypatch, {"hfta": 0.00595, "vmap": 0.00553, "loop": 0.00578}, 0.1)
    assert choice.backend.name == "hfta"
    assert choice.describe() == (
        "backend='auto' chose 'hfta' (forward+backward per step on the first batch: vmap 5.53 ms, loop 5.78 ms, "
        "hfta 5.95 ms; auto keeps the first of hfta, vmap, loop whose time is within 10% of the fastest, so that "
        "timing noise does not flip the choice: hfta took 7.6% longer than vmap); fused, the 2 trials step 1.0x as "
        "fast as one after another"
    )


def test_the_report_states_the_margin_when_the_fastest_wins(monkeypatch):
    choice = choice_with_step_times(monkeypatch, {"hfta": 0.009, "vmap": 0.004, "loop": 0.008}, 0.1)
    assert choice.backend.name == "vmap"
    assert choice.describe().endswith(
        "; auto keeps the first of hfta, vmap, loop whose time is within 10% of the fastest, so that timing noise "
        "does not flip the choice); fused, the 2 trials step 2.0x as fast as one after another"
    )


@pytest.mark.parametrize(
    ("seconds", "cores", "says"),
    [
        # fusing 2 trials gains 1.5x; 2 cores run both side by side: separate runs would likely be faster
        (
            {"vmap": 0.008, "loop": 0.012},
            2,
            "; this machine's 2 cores could run 2 of them side by side, one thread each: separate concurrent runs "
            "(e.g. hydra/launcher=joblib with n_jobs=2) would likely be faster",
        ),
        ({"vmap": 0.004, "loop": 0.010}, 2, ""),  # 2.5x: more than 2 cores side by side can gain
        ({"vmap": 0.008, "loop": 0.012}, 1, ""),  # one core: no side by side
        # an accelerator: how many runs it takes at once is not known here
        (
            {"vmap": 0.004, "loop": 0.010},
            None,
            " (separate concurrent runs beat that only where the device runs over 2.5 at once)",
        ),
    ],
)
def test_the_report_weighs_fusion_against_separate_concurrent_runs(monkeypatch, seconds, cores, says):
    choice = choice_with_step_times(monkeypatch, seconds, 0.1, cores=cores)
    gain = round(seconds["loop"] / seconds[choice.backend.name], 1)
    assert choice.describe().endswith(f"; fused, the 2 trials step {gain}x as fast as one after another{says}")
