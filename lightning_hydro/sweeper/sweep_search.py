"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.sweep_search`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "ChannelSpec",
    "K",
    "RUNG_FILE",
    "SAMPLER_FILE",
    "STATE_DIR",
    "SearchSpace",
    "StudyChannel",
    "SweepState",
    "Trial",
    "TrialGroup",
    "absorb_asked_trials",
    "partition_quotas",
    "rung_storage",
    "sampler_storage",
    "search_section",
    "sweep_name",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.sweep_search:{name}",
        f"moved to lightning_hydro.sweeper.planning.sweep_search.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
