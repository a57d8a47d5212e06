"""Samplers: draw configurations from a :class:`SearchSpace` (grid, seeded random, Optuna's TPE).

Every sampler has the same two verbs. ``ask(trial_ids)`` returns one configuration per new trial;
``tell(trial_id, configuration, feedback)`` reports what a trial achieved, so a model-based sampler can
learn between rounds (the sweeper asks and tells group by group). ``max_trials`` is how many distinct
configurations the sampler can produce (``None``: unbounded).

Example::

    >>> from lightning_hydro.sweeper.planning.search_space import parse_search_space
    >>> space = parse_search_space(["model.lr=0.1,0.2", "data.batch_size=32,64"])
    >>> sampler = make_sampler("grid", space, seed=0, mode="max")
    >>> sampler.max_trials
    4
    >>> [c.texts for c in sampler.ask([0, 1])]
    [{'model.lr': '0.1', 'data.batch_size': '32'}, {'model.lr': '0.1', 'data.batch_size': '64'}]
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from lightning_hydro._deprecation import Renamed, renamed_names
from lightning_hydro.stopping import TrialStatus
from lightning_hydro.sweeper.planning.search_space import Choice, Configuration, Interval, SearchSpace

__all__ = [
    "SAMPLERS",
    "GridSampler",
    "RandomSampler",
    "Sampler",
    "SamplerFeedback",
    "TPESampler",
    "make_sampler",
]

SAMPLERS = ("grid", "random", "tpe")
Mode = Literal["min", "max"]


@dataclass(frozen=True)
class SamplerFeedback:
    """What the sweeper tells a sampler about a trial whose group finished (``Sampler.tell``).

    Attributes:
        status: ``completed``, ``stopped`` (early stopping), ``diverged``, ``running`` or ``failed``.
        value: the sweep's metric at the end of the trial, ``None`` if it was never logged.
        budget: what the trial trained, in its result's ``budget_unit`` (epochs in a sweep).
    """

    status: TrialStatus
    value: float | None
    budget: int


# Old name, kept for one release.
__getattr__ = renamed_names(
    __name__,
    {
        "TrialOutcome": Renamed(
            f"{__name__}:SamplerFeedback",
            "is renamed SamplerFeedback (what a sampler is told about a trial; the callbacks' TrialEnding is how "
            "a callback ended one); import SamplerFeedback instead",
        )
    },
)


class Sampler(Protocol):
    """What the sweeper needs of a sampler."""

    @property
    def max_trials(self) -> int | None:
        """How many distinct configurations the sampler can produce (``None``: unbounded)."""
        ...

    def ask(self, trial_ids: Sequence[int]) -> list[Configuration]:
        """One new configuration per trial id."""
        ...

    def skip(self, n: int) -> None:
        """Move past ``n`` configurations asked before a resume (so a resumed sweep asks new ones)."""
        ...

    def tell(self, trial_id: int, configuration: Configuration, feedback: SamplerFeedback) -> None:
        """Report what a trial achieved."""
        ...


class GridSampler:
    """Every combination of the (discrete) dimensions, in order; a seeded subset if ``n_trials`` is smaller.

    Raises:
        ValueError: if a dimension is a continuous ``interval``.
    """

    def __init__(self, space: SearchSpace, *, seed: int, n_trials: int | None = None) -> None:
        for dim in space.dimensions:
            if isinstance(dim, Interval):
                raise ValueError(
                    f"lightning_hydro sweeper: sampler 'grid' needs discrete values, but '{dim.key}' is a "
                    "continuous interval. Fix: use choice(...) or range(...) for it, or "
                    "hydra.sweeper.sampler=random."
                )
        choices = [dim for dim in space.dimensions if isinstance(dim, Choice)]
        points = list(itertools.product(*(range(len(dim.values)) for dim in choices)))
        if n_trials is not None and n_trials < len(points):
            kept = sorted(random.Random(seed).sample(range(len(points)), n_trials))
            points = [points[i] for i in kept]
        self._choices = choices
        self._points = points
        self._next = 0

    @property
    def max_trials(self) -> int:
        """Size of the grid (after the ``n_trials`` subset)."""
        return len(self._points)

    def ask(self, trial_ids: Sequence[int]) -> list[Configuration]:
        """Return the next ``len(trial_ids)`` grid points."""
        out = []
        for _ in trial_ids:
            if self._next >= len(self._points):
                raise ValueError(f"GridSampler.ask: the grid has only {len(self._points)} points.")
            point = self._points[self._next]
            self._next += 1
            picks = [dim.at(i) for dim, i in zip(self._choices, point)]
            out.append(_configuration([dim.key for dim in self._choices], picks))
        return out

    def skip(self, n: int) -> None:
        """Skip ``n`` points (already asked before a resume)."""
        self._next += n

    def tell(self, trial_id: int, configuration: Configuration, feedback: SamplerFeedback) -> None:
        """A grid does not learn."""


class RandomSampler:
    """Independent uniform draws (log-uniform for ``tag(log, ...)``) from a seeded generator."""

    def __init__(self, space: SearchSpace, *, seed: int) -> None:
        self._space = space
        self._rng = random.Random(seed)

    @property
    def max_trials(self) -> None:
        """Unbounded."""
        return None

    def ask(self, trial_ids: Sequence[int]) -> list[Configuration]:
        """Draw one configuration per trial id."""
        return [self._draw() for _ in trial_ids]

    def skip(self, n: int) -> None:
        """Advance the generator past ``n`` draws (already asked before a resume)."""
        for _ in range(n):
            self._draw()

    def _draw(self) -> Configuration:
        picks = []
        for dim in self._space.dimensions:
            if isinstance(dim, Choice):
                picks.append(dim.at(self._rng.randrange(len(dim.values))))
            elif dim.log:
                picks.append(dim.at(math.exp(self._rng.uniform(math.log(dim.low), math.log(dim.high)))))
            else:
                picks.append(dim.at(self._rng.uniform(dim.low, dim.high)))
        return _configuration(self._space.keys, picks)

    def tell(self, trial_id: int, configuration: Configuration, feedback: SamplerFeedback) -> None:
        """Random search does not learn."""


class TPESampler:
    """Optuna's Tree-structured Parzen Estimator, asked and told trial by trial.

    Categorical dimensions are given to Optuna as their override texts. Trials told without having been
    asked by this sampler (finished before a resume) are added to the study as already-finished trials.

    Raises:
        ImportError: if Optuna is not installed.
    """

    def __init__(self, space: SearchSpace, *, seed: int, mode: Mode) -> None:
        try:
            import optuna
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                "lightning_hydro sweeper: sampler 'tpe' needs Optuna: pip install 'lightning-hydro[optuna]', "
                "or use hydra.sweeper.sampler=random."
            ) from err
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self._space = space
        self._study = optuna.create_study(
            direction="maximize" if mode == "max" else "minimize",
            sampler=optuna.samplers.TPESampler(seed=seed),
        )
        self._distributions = {dim.key: optuna_distribution(self._optuna, dim) for dim in space.dimensions}
        self._asked: dict[int, Any] = {}

    @property
    def max_trials(self) -> None:
        """Unbounded."""
        return None

    def ask(self, trial_ids: Sequence[int]) -> list[Configuration]:
        """Ask Optuna for one configuration per trial id."""
        out = []
        for trial_id in trial_ids:
            trial = self._study.ask(self._distributions)
            self._asked[trial_id] = trial
            picks = []
            for dim in self._space.dimensions:
                raw = trial.params[dim.key]
                picks.append(dim.at(dim.texts.index(raw)) if isinstance(dim, Choice) else dim.at(raw))
            out.append(_configuration(self._space.keys, picks))
        return out

    def skip(self, n: int) -> None:
        """Nothing to skip: finished trials are told, unfinished ones are relaunched as they were."""

    def tell(self, trial_id: int, configuration: Configuration, feedback: SamplerFeedback) -> None:
        """Report a trial: ``completed`` with its value, ``stopped`` as pruned at its budget, else failed."""
        state = self._optuna.trial.TrialState
        value = feedback.value if feedback.value is not None and math.isfinite(feedback.value) else None
        if value is not None and feedback.status == "completed":
            kind, reported = state.COMPLETE, None
        elif value is not None and feedback.status == "stopped":
            kind, reported, value = state.PRUNED, {feedback.budget: value}, None
        else:
            kind, reported, value = state.FAIL, None, None
        trial = self._asked.pop(trial_id, None)
        if trial is not None:
            for step, intermediate in (reported or {}).items():
                trial.report(intermediate, step=step)
            self._study.tell(trial, value, state=kind)
            return
        params: dict[str, Any] = {}
        for dim in self._space.dimensions:
            params[dim.key] = configuration.texts[dim.key] if isinstance(dim, Choice) else configuration.values[dim.key]
        self._study.add_trial(
            self._optuna.trial.create_trial(
                params=params,
                distributions=self._distributions,
                value=value,
                state=kind,
                intermediate_values=reported,
            )
        )


def optuna_distribution(optuna: Any, dim: Choice | Interval) -> Any:
    """The Optuna distribution of one search-space dimension (``optuna``: the imported module)."""
    dists = optuna.distributions
    if isinstance(dim, Choice):
        return dists.CategoricalDistribution(list(dim.texts))
    if dim.integer:
        return dists.IntDistribution(math.ceil(dim.low), math.floor(dim.high), log=dim.log)
    return dists.FloatDistribution(dim.low, dim.high, log=dim.log)


def make_sampler(
    name: str, space: SearchSpace, *, seed: int, mode: Mode, n_trials: int | None = None
) -> GridSampler | RandomSampler | TPESampler:
    """Build the sampler called ``name`` (one of :data:`SAMPLERS`) over ``space``.

    Raises:
        ValueError: if ``name`` is unknown.
    """
    if name == "grid":
        return GridSampler(space, seed=seed, n_trials=n_trials)
    if name == "random":
        return RandomSampler(space, seed=seed)
    if name == "tpe":
        return TPESampler(space, seed=seed, mode=mode)
    raise ValueError(
        f"lightning_hydro sweeper: unknown sampler {name!r}; expected one of {list(SAMPLERS)}. Fix: e.g. "
        "hydra.sweeper.sampler=random."
    )


def _configuration(keys: Sequence[str], picks: Sequence[tuple[Any, str]]) -> Configuration:
    return Configuration(
        values={k: value for k, (value, _) in zip(keys, picks)},
        texts={k: text for k, (_, text) in zip(keys, picks)},
    )
