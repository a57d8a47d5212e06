import math

import pytest

from lightning_hydro.scaling.rank_fidelity import (
    metric_spread,
    rank_fidelity,
    rank_fidelity_difference,
    seed_means,
    spearman,
)

INF = math.inf


def test_spearman_uses_average_ranks_and_ranks_diverged_runs_last():
    assert spearman([1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]) == pytest.approx(1.0)
    assert spearman([1.0, 2.0, 3.0], [INF, 2.0, 1.0]) == pytest.approx(-1.0)
    # a tie: ranks (0.5, 0.5, 2) against (0, 1, 2)
    assert spearman([1.0, 1.0, 2.0], [1.0, 2.0, 3.0]) == pytest.approx(0.8660254)
    assert spearman([INF, math.nan, 1.0], [3.0, 2.0, 1.0]) == pytest.approx(0.8660254)  # nan and inf tie last
    assert math.isnan(spearman([1.0, 1.0], [1.0, 2.0]))


def test_spearman_refuses_sides_of_different_lengths():
    with pytest.raises(ValueError, match="one value per configuration, got 2 and 3"):
        spearman([1.0, 2.0], [1.0, 2.0, 3.0])


def test_seed_means_are_infinite_when_any_seed_diverged():
    assert seed_means([[1.0, 3.0], [2.0, INF], [5.0]]) == [2.0, INF, 5.0]
    with pytest.raises(ValueError, match="at least one seed"):
        seed_means([[1.0], []])


def test_the_interval_is_reproducible_contains_the_estimate_and_narrows_with_agreement():
    target = [[float(i), i + 0.1, i - 0.1] for i in range(12)]
    faithful = [[2.0 * i + 1, 2.0 * i + 1.02, 2.0 * i + 0.98] for i in range(12)]  # seeds far below the gaps
    noisy = [[i + ((-1) ** i) * 3.0, i + 0.5, i - 0.5] for i in range(12)]
    a = rank_fidelity(target, faithful, resamples=300, seed=1)
    assert a == rank_fidelity(target, faithful, resamples=300, seed=1)
    assert a.rho == pytest.approx(1.0)
    assert a.low > 0.95
    b = rank_fidelity(target, noisy, resamples=300)
    assert b.low <= b.rho <= b.high
    assert b.high - b.low > 0.05
    assert b.rho < a.rho


def test_seeds_are_resampled_so_seed_noise_widens_the_interval():
    # the seed means rank perfectly, but single seeds disagree: the interval must show it
    target = [[float(i)] * 3 for i in range(10)]
    noisy = [[i - 4.0, i + 4.0, float(i)] for i in range(10)]
    result = rank_fidelity(target, noisy, resamples=500)
    assert result.rho == pytest.approx(1.0)
    assert result.low < 0.9


def test_the_paired_difference_favours_the_faithful_surrogate():
    target = [[float(i), i + 0.2] for i in range(10)]
    faithful = [[i + 0.1, i + 0.3] for i in range(10)]
    reversed_ = [[10.0 - i, 10.2 - i] for i in range(10)]
    difference = rank_fidelity_difference(target, faithful, target, reversed_, resamples=300)
    assert difference.rho == pytest.approx(2.0)
    assert difference.low > 1.5


def test_mismatched_configurations_and_bad_settings_are_refused():
    with pytest.raises(ValueError, match="same configurations, got 2 and 3"):
        rank_fidelity([[1.0], [2.0]], [[1.0], [2.0], [3.0]])
    with pytest.raises(ValueError, match="resamples must be >= 1 and confidence in"):
        rank_fidelity([[1.0], [2.0]], [[1.0], [2.0]], confidence=1.5)


def test_metric_spread_counts_the_pairs_that_seeds_resolve():
    values = [[1.0, 1.0], [1.0, 1.2], [3.0, 3.1], [INF, 2.0]]
    spread = metric_spread(values)
    assert spread["range"] == pytest.approx(3.05 - 1.0)
    assert spread["diverged"] == 1.0
    # pairs of finite means: (1.0, 1.1) unresolved; (1.0, 3.05) and (1.1, 3.05) resolved
    assert spread["resolved"] == pytest.approx(2 / 3)
    assert spread["seed_std"] == pytest.approx(math.sqrt(0.005))  # median of 0, 0.0707, 0.1414
