"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.study_channel`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "ChannelSpec",
    "Choice",
    "Configuration",
    "STUDY_NAME",
    "SearchSpace",
    "StudyChannel",
    "is_learning_sampler",
    "optuna_distribution",
    "parse_search_space",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.study_channel:{name}",
        f"moved to lightning_hydro.sweeper.planning.study_channel.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
