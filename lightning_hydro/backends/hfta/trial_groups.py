"""Moved to :mod:`lightning_hydro.backends.hfta.trial_grouped_module` (named after its class).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(
            f"lightning_hydro.backends.hfta.trial_grouped_module:{name}",
            f"moved to lightning_hydro.backends.hfta.trial_grouped_module.{name} (sweeper/trial_groups.py is "
            "unrelated); import it from there",
        )
        for name in ("TrialGroupedFunction", "TrialGroupedModule", "group_trials", "grouped_rule")
    },
)
