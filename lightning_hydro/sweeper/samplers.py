"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.samplers`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "Choice",
    "Configuration",
    "GridSampler",
    "Interval",
    "Mode",
    "RandomSampler",
    "SAMPLERS",
    "Sampler",
    "SamplerFeedback",
    "SearchSpace",
    "TPESampler",
    "TrialStatus",
    "make_sampler",
    "optuna_distribution",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.samplers:{name}",
        f"moved to lightning_hydro.sweeper.planning.samplers.{name}; import it from there",
    )
    for name in _NAMES
}

_RENAMED["TrialOutcome"] = Renamed(
    "lightning_hydro.sweeper.planning.samplers:SamplerFeedback",
    "is renamed SamplerFeedback (what a sampler is told about a trial; the callbacks' TrialEnding is how "
    "a callback ended one) and moved to lightning_hydro.sweeper.planning.samplers; import SamplerFeedback "
    "from there",
)

__getattr__ = renamed_names(__name__, _RENAMED)
