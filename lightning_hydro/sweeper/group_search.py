"""Moved to the job's side: :mod:`lightning_hydro.sweeper.job.group_search`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "ASKED_FILE",
    "AppendResult",
    "ChannelSpec",
    "EarlyStoppingSpec",
    "ForwardingRungStore",
    "GroupSearch",
    "RungEntry",
    "RungRecord",
    "RungStore",
    "SWEEP_TRIAL_PREFIX",
    "StudyChannel",
    "TrialTeller",
    "group_stopping",
    "open_store",
    "read_json",
    "sweep_rung_store",
    "sweep_trial",
    "write_json_atomic",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.job.group_search:{name}",
        f"moved to lightning_hydro.sweeper.job.group_search.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
