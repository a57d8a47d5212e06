"""Cost-aware grouping of trials of different widths (issue 14 item 3)."""

from __future__ import annotations

import random

import pytest

from lightning_hydro.sweeper.planning.width_groups import chain_cost, group_by_padded_cost


def test_every_group_respects_the_bound_and_the_size_and_every_trial_is_placed_once() -> None:
    rng = random.Random(0)
    widths = {t: {"lin1": rng.choice([32, 64, 128, 256]), "lin2": rng.choice([32, 64, 128, 256])} for t in range(40)}
    groups = group_by_padded_cost(widths, max_overhead=0.5, max_size=8)
    assert sorted(t for g in groups for t in g.trial_ids) == list(range(40))
    for group in groups:
        assert len(group.trial_ids) <= 8
        assert group.overhead <= 0.5 + 1e-9
        own = sum(chain_cost(widths[t]) for t in group.trial_ids)
        assert group.overhead == pytest.approx(len(group.trial_ids) * chain_cost(group.padded) / own - 1)
        assert group.padded == {k: max(widths[t][k] for t in group.trial_ids) for k in ("lin1", "lin2")}


def test_zero_overhead_fuses_only_equal_widths_and_a_loose_bound_fills_groups() -> None:
    widths = {0: {"h": 32}, 1: {"h": 64}, 2: {"h": 32}, 3: {"h": 64}}
    assert [g.trial_ids for g in group_by_padded_cost(widths, max_overhead=0.0, max_size=8)] == [(0, 2), (1, 3)]
    loose = group_by_padded_cost(widths, max_overhead=10.0, max_size=3)
    assert [g.trial_ids for g in loose] == [(0, 2, 1), (3,)]
    assert loose[0].overhead == pytest.approx(3 * 128 / (64 + 64 + 128) - 1)


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match=r"max_overhead must be >= 0, got -1"):
        group_by_padded_cost({0: {"h": 1}}, max_overhead=-1, max_size=2)
    with pytest.raises(ValueError, match=r"max_size must be >= 1, got 0"):
        group_by_padded_cost({0: {"h": 1}}, max_overhead=0, max_size=0)
    with pytest.raises(ValueError, match=r"every trial must name the same width keys.*give each trial all of them"):
        group_by_padded_cost({0: {"h": 1}, 1: {"g": 2}}, max_overhead=0, max_size=2)
