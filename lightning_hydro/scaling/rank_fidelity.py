"""Rank fidelity of a surrogate: does it order configurations as the full-size target does?

Pure Python (no torch): each configuration's metric is the mean over its seeds; the fidelity is Spearman's
rho between the surrogate's and the target's means, with a bootstrap interval that resamples both the
configurations and, within each, the seeds, so that it covers which configurations were drawn and the
seed noise of both models. A non-finite metric (a diverged run) ranks last.

Example::

    >>> target = [[0.10, 0.12], [0.20, 0.22], [0.30, 0.29], [0.40, 0.41]]   # 4 configurations x 2 seeds
    >>> surrogate = [[0.5, 0.6], [0.7, 0.7], [0.9, 1.0], [float("inf"), 1.2]]
    >>> round(spearman([0.1, 0.2, 0.3], [3.0, 2.0, 1.0]), 6)
    -1.0
    >>> result = rank_fidelity(target, surrogate, resamples=200)
    >>> round(result.rho, 6), result.low <= result.rho <= result.high
    (1.0, True)
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Interval", "metric_spread", "rank_fidelity", "rank_fidelity_difference", "seed_means", "spearman"]

Seeds = Sequence[float]
"""One configuration's metric, one value per seed."""


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap percentile interval."""

    rho: float
    low: float
    high: float

    def describe(self, digits: int = 3) -> str:
        """``"0.912 [0.850, 0.960]"``."""
        return f"{self.rho:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho with average ranks for ties; non-finite values rank last (and tie with each other).

    Returns NaN when either side is constant (every value tied).
    """
    if len(a) != len(b):
        raise ValueError(f"spearman: the two sides must have one value per configuration, got {len(a)} and {len(b)}.")
    return _pearson(_ranks(a), _ranks(b))


def seed_means(values: Sequence[Seeds]) -> list[float]:
    """Each configuration's mean over its seeds; ``inf`` when any seed diverged (non-finite)."""
    means = []
    for seeds in values:
        if not seeds:
            raise ValueError("seed_means: every configuration needs at least one seed's value, got an empty list.")
        means.append(sum(seeds) / len(seeds) if all(math.isfinite(v) for v in seeds) else math.inf)
    return means


def rank_fidelity(
    target: Sequence[Seeds],
    surrogate: Sequence[Seeds],
    *,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Spearman's rho of the seed means, with a two-level bootstrap interval (configurations, then seeds).

    Args:
        target: per configuration, the full-size model's metric for each seed.
        surrogate: the same for the surrogate, configurations in the same order.
        resamples: bootstrap replicates.
        confidence: coverage of the percentile interval.
        seed: seeds the bootstrap's generator, so that the interval is reproducible.
    """
    return _bootstrap([(target, surrogate)], resamples, confidence, seed, difference=False)


def rank_fidelity_difference(
    target_a: Sequence[Seeds],
    surrogate_a: Sequence[Seeds],
    target_b: Sequence[Seeds],
    surrogate_b: Sequence[Seeds],
    *,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """rho(a) - rho(b) over the same configurations (paired: each replicate draws one set for both).

    E.g. a = muP and b = standard parametrization: an interval above 0 says muP ranks better.
    """
    pairs = [(target_a, surrogate_a), (target_b, surrogate_b)]
    return _bootstrap(pairs, resamples, confidence, seed, difference=True)


def metric_spread(values: Sequence[Seeds]) -> dict[str, float]:
    """How far apart the configurations are, against their seed noise (of the seed means).

    Returns ``range`` (max - min of the finite means), ``seed_std`` (median over configurations of the
    standard deviation across seeds), ``diverged`` (configurations with a non-finite mean) and
    ``resolved`` (share of configuration pairs whose means differ by more than twice their combined
    standard error: the pairs whose order the seeds agree on; a ranking of near-ties means little).
    """
    means = seed_means(values)
    finite = [(m, seeds) for m, seeds in zip(means, values) if math.isfinite(m)]
    stds = [_std(seeds) for _, seeds in finite]
    errors = [s / math.sqrt(len(seeds)) for s, (_, seeds) in zip(stds, finite)]
    pairs = resolved = 0
    for i in range(len(finite)):
        for j in range(i + 1, len(finite)):
            pairs += 1
            resolved += abs(finite[i][0] - finite[j][0]) > 2.0 * math.hypot(errors[i], errors[j])
    return {
        "range": max(m for m, _ in finite) - min(m for m, _ in finite) if finite else math.nan,
        "seed_std": sorted(stds)[len(stds) // 2] if stds else math.nan,
        "diverged": float(len(means) - len(finite)),
        "resolved": resolved / pairs if pairs else math.nan,
    }


def _bootstrap(
    pairs: Sequence[tuple[Sequence[Seeds], Sequence[Seeds]]],
    resamples: int,
    confidence: float,
    seed: int,
    *,
    difference: bool,
) -> Interval:
    n = len(pairs[0][0])
    for target, surrogate in pairs:
        if len(target) != n or len(surrogate) != n:
            raise ValueError(
                f"rank_fidelity: target and surrogate must list the same configurations, got {len(target)} and "
                f"{len(surrogate)} (expected {n})."
            )
    if resamples < 1 or not 0.0 < confidence < 1.0:
        raise ValueError(
            f"rank_fidelity: resamples must be >= 1 and confidence in (0, 1), got {resamples} and {confidence}."
        )
    rhos = [spearman(seed_means(t), seed_means(s)) for t, s in pairs]
    point = rhos[0] - rhos[1] if difference else rhos[0]
    rng = random.Random(seed)
    draws: list[float] = []
    for _ in range(resamples):
        configs = [rng.randrange(n) for _ in range(n)]
        replicate = []
        for target, surrogate in pairs:
            # seeds resampled once per drawn configuration: a configuration drawn twice is one point twice
            means_t = {c: seed_means([_resample(target[c], rng)])[0] for c in sorted(set(configs))}
            means_s = {c: seed_means([_resample(surrogate[c], rng)])[0] for c in sorted(set(configs))}
            replicate.append(spearman([means_t[c] for c in configs], [means_s[c] for c in configs]))
        value = replicate[0] - replicate[1] if difference else replicate[0]
        if not math.isnan(value):  # a replicate that drew one configuration n times has no ranking
            draws.append(value)
    draws.sort()
    if not draws:
        return Interval(point, math.nan, math.nan)
    tail = (1.0 - confidence) / 2.0
    low = draws[min(len(draws) - 1, int(tail * len(draws)))]
    high = draws[max(0, math.ceil((1.0 - tail) * len(draws)) - 1)]
    return Interval(point, low, high)


def _resample(seeds: Seeds, rng: random.Random) -> list[float]:
    return [seeds[rng.randrange(len(seeds))] for _ in seeds]


def _std(values: Seeds) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _ranks(values: Sequence[float]) -> list[float]:
    keyed = [v if math.isfinite(v) else math.inf for v in values]
    order = sorted(range(len(keyed)), key=lambda i: keyed[i])
    ranks = [0.0] * len(keyed)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and keyed[order[end + 1]] == keyed[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2.0
        start = end + 1
    return ranks


def _pearson(x: Sequence[float], y: Sequence[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sx = math.sqrt(sum((a - mx) ** 2 for a in x))
    sy = math.sqrt(sum((b - my) ** 2 for b in y))
    return cov / (sx * sy) if sx and sy else float("nan")
