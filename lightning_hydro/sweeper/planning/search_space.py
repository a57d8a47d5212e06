"""The search space: override strings in Hydra's grammar, parsed into dimensions a sampler draws from.

Supported values, from ``hydra.sweeper.params`` or the command line:

- ``key=a,b,c`` and ``key=choice(a, b, c)``: a categorical dimension (any override values);
- ``key=range(start, stop[, step])``: the numbers of the range, as a categorical dimension;
- ``key=interval(low, high)``: a continuous dimension; ``tag(log, interval(...))`` samples it on a log
  scale and ``tag(int, interval(...))`` rounds it to integers (both tags may be combined);
- ``key=value``: a fixed override passed unchanged to every job.

Example::

    >>> space = parse_search_space(["model.lr=tag(log, interval(1e-4, 1))", "data.batch_size=32,64"])
    >>> [d.key for d in space.dimensions]
    ['model.lr', 'data.batch_size']
    >>> space.dimensions[1].texts
    ('32', '64')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep, Transformer
from hydra.errors import HydraException

__all__ = [
    "Choice",
    "Configuration",
    "Dimension",
    "Interval",
    "SearchSpace",
    "override_key",
    "parse_search_space",
]

INTERVAL_TAGS = frozenset({"log", "int"})
_EXAMPLES = "e.g. 'model.lr=tag(log, interval(1e-4, 1))', 'model.momentum=choice(0.8, 0.9)' or 'data.batch_size=32,64'"


@dataclass(frozen=True)
class Choice:
    """A categorical dimension: one of ``values`` (Python values), written as ``texts`` in overrides."""

    key: str
    values: tuple[Any, ...]
    texts: tuple[str, ...]
    prefix: str = ""

    def at(self, index: int) -> tuple[Any, str]:
        """Return the value and override text of choice ``index``."""
        return self.values[index], self.texts[index]


@dataclass(frozen=True)
class Interval:
    """A continuous dimension ``[low, high]``, sampled uniformly or on a log scale, maybe as integers."""

    key: str
    low: float
    high: float
    log: bool = False
    integer: bool = False
    prefix: str = ""

    def at(self, x: float) -> tuple[Any, str]:
        """Return the value at ``x`` (clipped to the interval, rounded if integer) and its override text."""
        x = min(max(float(x), self.low), self.high)
        if self.integer:
            value = round(x)
            return value, str(value)
        return x, repr(x)


Dimension = Choice | Interval


@dataclass(frozen=True)
class Configuration:
    """One point of a search space: the Python value and the override text of each swept key."""

    values: dict[str, Any]
    texts: dict[str, str]


@dataclass(frozen=True)
class SearchSpace:
    """Swept dimensions plus the fixed overrides that every job receives unchanged."""

    dimensions: tuple[Dimension, ...]
    fixed: tuple[str, ...] = field(default=())

    @property
    def keys(self) -> list[str]:
        """The swept keys, in order of appearance."""
        return [d.key for d in self.dimensions]

    def dimension(self, key: str) -> Dimension:
        """Return the dimension of ``key``."""
        for dim in self.dimensions:
            if dim.key == key:
                return dim
        raise KeyError(key)

    def override_lines(self, texts: Mapping[str, str], keys: Sequence[str] | None = None) -> list[str]:
        """Write ``key=text`` override lines (with ``+``/``++`` where given) for ``keys`` (default: all)."""
        chosen = self.keys if keys is None else list(keys)
        return [f"{self.dimension(k).prefix}{k}={texts[k]}" for k in chosen]


def parse_search_space(lines: Sequence[str]) -> SearchSpace:
    """Parse override lines into a :class:`SearchSpace` (a later line for a key replaces an earlier one).

    Raises:
        ValueError: if a line is not valid override grammar, uses an unsupported sweep, describes an empty
            dimension, or if no line sweeps anything.
    """
    parser = OverridesParser.create()
    dims: dict[str, Dimension] = {}
    fixed: dict[str, str] = {}
    for line in lines:
        try:
            (override,) = parser.parse_overrides([line])
        except HydraException as err:
            raise ValueError(
                f"lightning_hydro sweeper: cannot parse search space entry {line!r}: {_one_line(err)}. "
                f"Expected Hydra's override grammar, {_EXAMPLES}."
            ) from err
        key = override.get_key_element().lstrip("+~")
        dims.pop(key, None)
        fixed.pop(key, None)
        if override.is_sweep_override():
            dims[key] = _dimension(override, key, line, parser)
        else:
            fixed[key] = line
    if not dims:
        raise ValueError(
            "lightning_hydro sweeper: the search space is empty: no key is swept. Expected at least one "
            f"swept key in hydra.sweeper.params or on the command line, {_EXAMPLES}."
        )
    return SearchSpace(dimensions=tuple(dims.values()), fixed=tuple(fixed.values()))


def override_key(line: str) -> str:
    """The bare key of an override line (no ``+``/``++``/``~`` prefix): ``override_key("+a.b=1") == "a.b"``.

    Raises:
        ValueError: if ``line`` is not valid override grammar.
    """
    try:
        (override,) = OverridesParser.create().parse_overrides([line])
    except HydraException as err:
        raise ValueError(f"lightning_hydro sweeper: cannot parse override {line!r}: {_one_line(err)}") from err
    return override.get_key_element().lstrip("+~")


def _dimension(override: Override, key: str, line: str, parser: OverridesParser) -> Dimension:
    if override.is_hydra_override():
        raise ValueError(
            f"lightning_hydro sweeper: {line!r} sweeps Hydra's own config; only keys of the app's config can "
            "be searched. Fix: give a single value, or sweep a key of your config instead."
        )
    if override.is_delete():
        raise ValueError(f"lightning_hydro sweeper: {line!r} sweeps a deletion ('~'); give the key a value instead.")
    prefix = "++" if override.is_force_add() else "+" if override.is_add() else ""
    sweep = override.value()
    if isinstance(sweep, IntervalSweep):
        return _interval(sweep, key, line, prefix)
    if isinstance(sweep, ChoiceSweep | RangeSweep):
        if sweep.tags:
            raise ValueError(
                f"lightning_hydro sweeper: {line!r} tags a {type(sweep).__name__}; tags "
                f"({', '.join(sorted(INTERVAL_TAGS))}) apply to interval(...) only. Fix: remove the tag, or "
                "use tag(log, interval(low, high))."
            )
        texts = [Transformer.str(x) for x in sweep.list] if isinstance(sweep, ChoiceSweep) else _range_texts(sweep)
        if not texts:
            raise ValueError(f"lightning_hydro sweeper: {line!r} has no values; give at least one value.")
        values = [parser.parse_overrides([f"x={text}"])[0].value() for text in texts]
        return Choice(key=key, values=tuple(values), texts=tuple(texts), prefix=prefix)
    raise ValueError(
        f"lightning_hydro sweeper: {line!r} is not supported (glob sweeps need the config's option list). "
        "Fix: list the options, e.g. 'model=choice(small, large)'."
    )


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def _range_texts(sweep: RangeSweep) -> list[str]:
    return [Transformer.str(x) for x in sweep.range()]


def _interval(sweep: IntervalSweep, key: str, line: str, prefix: str) -> Interval:
    unknown = set(sweep.tags) - INTERVAL_TAGS
    if unknown:
        raise ValueError(
            f"lightning_hydro sweeper: {line!r} has unknown tag(s) {sorted(unknown)}; supported tags are "
            f"{sorted(INTERVAL_TAGS)}, e.g. 'tag(log, interval(1e-4, 1))'."
        )
    if sweep.start is None or sweep.end is None:  # pragma: no cover - the grammar requires both bounds
        raise ValueError(f"lightning_hydro sweeper: {line!r} needs both bounds: interval(low, high).")
    low, high = float(sweep.start), float(sweep.end)
    if not low < high:
        raise ValueError(
            f"lightning_hydro sweeper: {line!r} is an empty interval: expected low < high, got low={low}, "
            f"high={high}. Fix: swap or widen the bounds."
        )
    log = "log" in sweep.tags
    if log and low <= 0:
        raise ValueError(
            f"lightning_hydro sweeper: {line!r} samples on a log scale from {low}; a log interval needs "
            "low > 0. Fix: use a positive lower bound such as 1e-5, or drop the log tag."
        )
    integer = "int" in sweep.tags
    if integer and math.floor(high) < math.ceil(low):
        raise ValueError(f"lightning_hydro sweeper: {line!r} holds no integer; widen the interval.")
    return Interval(key=key, low=low, high=high, log=log, integer=integer, prefix=prefix)
