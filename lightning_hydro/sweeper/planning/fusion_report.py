"""Say at launch when the search space leaves nothing to fuse (every group holds one trial).

Example::

    >>> from lightning_hydro.sweeper.planning.trial_groups import TrialGroup
    >>> groups = [TrialGroup(f"g{i}", "search", (i,), 1, (("data.batch_size", str(i)),)) for i in range(3)]
    >>> print(nothing_fuses_message(groups, ["data.batch_size"], ["data.batch_size", "model.lr"]))
    lightning_hydro sweeper: nothing fuses: the 3 trials fall into 3 groups of one trial each, because ...
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from lightning_hydro.sweeper.planning.trial_groups import TrialGroup

__all__ = ["nothing_fuses_message", "warn_if_nothing_fuses"]

log = logging.getLogger(__name__)


def nothing_fuses_message(
    groups: Sequence[TrialGroup], non_fusible: Sequence[str], searched: Sequence[str]
) -> str | None:
    """The warning for ``groups`` that are all single trials (of more than one), or ``None``."""
    n_trials = sum(len(g.trial_ids) for g in groups)
    if n_trials < 2 or any(len(g.trial_ids) > 1 for g in groups):
        return None
    splitting = [k for k in searched if k in non_fusible]
    keys = ", ".join(splitting) or "(none searched: the fusion limit is 1)"
    return (
        f"lightning_hydro sweeper: nothing fuses: the {n_trials} trials fall into {len(groups)} groups of one "
        f"trial each, because they differ in the non-fusible keys {keys}, and each group trains alone. "
        "Remedies: search those keys in a separate, earlier stage (a few values, e.g. a grid) and fix them "
        "here; narrow their choices so that several trials share each value; or, for a width, let the muP "
        "surrogate fix it (the app config's 'scaling' section: search at one surrogate width, retrain the "
        "best at full size). Fusible keys (under 'model', same shapes) can take any value within a group."
    )


def warn_if_nothing_fuses(groups: Sequence[TrialGroup], non_fusible: Sequence[str], searched: Sequence[str]) -> None:
    """Log :func:`nothing_fuses_message` as a warning when it applies."""
    message = nothing_fuses_message(groups, non_fusible, searched)
    if message is not None:
        log.warning("%s", message)
