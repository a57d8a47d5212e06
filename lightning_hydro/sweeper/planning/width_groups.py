"""Cost-aware groups for trials of different widths: similar widths together, padding overhead bounded.

A trial padded to its group's widths costs as much as a trial at those widths: one at width 32 in a group
padded to 512 pays for 512. So trials are sorted by their own cost and cut into groups greedily: the next
trial joins the current group while the group's *padding overhead* stays within ``max_overhead`` and the group
has room; otherwise it starts a new group. The overhead of a group is what its padded trials cost over what
they would cost at their own widths::

    overhead = size * cost(elementwise largest widths) / sum(cost(own widths)) - 1

Pure Python: the cost of a width assignment is a callable (default :func:`chain_cost`, the weight count of
a chain of Linear layers whose hidden sizes are the widths in key order).

Example::

    >>> widths = {0: {"h": 32}, 1: {"h": 512}, 2: {"h": 48}, 3: {"h": 40}}
    >>> groups = group_by_padded_cost(widths, max_overhead=0.5, max_size=8)
    >>> [(g.trial_ids, g.padded, round(g.overhead, 2)) for g in groups]
    [((0, 3, 2), {'h': 48}, 0.2), ((1,), {'h': 512}, 0.0)]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["WidthGroup", "chain_cost", "group_by_padded_cost"]

Widths = Mapping[str, int]


def chain_cost(widths: Widths) -> float:
    """Weights of a chain of layers through the hidden sizes in key order (inputs and outputs of size 1).

    Example::

        >>> chain_cost({"lin1": 4, "lin2": 8})   # 1*4 + 4*8 + 8*1
        44.0
    """
    sizes = [1, *widths.values(), 1]
    return float(sum(a * b for a, b in itertools.pairwise(sizes)))


@dataclass(frozen=True)
class WidthGroup:
    """Trials fused at one padded width.

    Attributes:
        trial_ids: the trials, cheapest first.
        padded: the elementwise largest widths: what every trial of the group computes at.
        overhead: padded cost over own cost, minus 1 (0.0: no padding).
    """

    trial_ids: tuple[int, ...]
    padded: dict[str, int]
    overhead: float


def _padded(widths: list[Widths]) -> dict[str, int]:
    return {key: max(w[key] for w in widths) for key in widths[0]}


def _overhead(widths: list[Widths], cost: Callable[[Widths], float]) -> float:
    own = sum(cost(w) for w in widths)
    return len(widths) * cost(_padded(widths)) / own - 1.0 if own > 0 else 0.0


def group_by_padded_cost(
    widths: Mapping[int, Widths],
    *,
    max_overhead: float,
    max_size: int,
    cost: Callable[[Widths], float] = chain_cost,
) -> list[WidthGroup]:
    """Cut trials (sorted by own cost) into groups whose padding overhead is at most ``max_overhead``.

    Args:
        widths: each trial's hidden sizes, by trial id (every trial names the same keys).
        max_overhead: the largest padding overhead a group may have (0.0: only equal widths fuse).
        max_size: the most trials in a group (the fusion limit).
        cost: the cost of one trial at the given widths.

    Raises:
        ValueError: for a negative ``max_overhead``, ``max_size < 1``, or trials naming different keys.
    """
    if max_overhead < 0:
        raise ValueError(f"group_by_padded_cost: max_overhead must be >= 0, got {max_overhead}.")
    if max_size < 1:
        raise ValueError(f"group_by_padded_cost: max_size must be >= 1, got {max_size}.")
    keys = {tuple(sorted(w)) for w in widths.values()}
    if len(keys) > 1:
        raise ValueError(
            f"group_by_padded_cost: every trial must name the same width keys, got {sorted(keys)}; "
            "give each trial all of them."
        )
    order = sorted(widths, key=lambda tid: (cost(widths[tid]), tid))
    groups: list[list[int]] = []
    for tid in order:
        current = groups[-1] if groups else None
        if current is not None and len(current) < max_size:
            candidate = [widths[t] for t in [*current, tid]]
            if _overhead(candidate, cost) <= max_overhead + 1e-12:
                current.append(tid)
                continue
        groups.append([tid])
    return [
        WidthGroup(tuple(ids), _padded([widths[t] for t in ids]), _overhead([widths[t] for t in ids], cost))
        for ids in groups
    ]
