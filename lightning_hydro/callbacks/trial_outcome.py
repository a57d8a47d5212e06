"""Deprecated module: ``TrialOutcome`` is now :class:`~lightning_hydro.callbacks.trial_ending.TrialEnding`."""

from lightning_hydro._deprecation import Renamed, renamed_names

__getattr__ = renamed_names(
    __name__,
    {
        "TrialOutcome": Renamed(
            "lightning_hydro.callbacks.trial_ending:TrialEnding",
            "is renamed lightning_hydro.callbacks.trial_ending.TrialEnding; import TrialEnding from there",
        ),
        "format_summary": Renamed(
            "lightning_hydro.callbacks.trial_ending:format_summary",
            "is now lightning_hydro.callbacks.trial_ending.format_summary; import it from there",
        ),
    },
)
