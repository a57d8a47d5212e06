"""Building a group's trial modules, each trial whose module raises recorded as ``failed`` with its error.

The user's module may raise when built (``model.optimizer=bogus`` in a choice): that trial fails alone, its group-mates
train, and the group's result records it with status ``failed`` and the module's own error (unwrapped from Hydra's
``InstantiationException``). Both routes of a group job build their trials here: ``fit_from_config``
(:mod:`.fit_trials`) and the user's own task function (:mod:`.sweep_group_module`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

import lightning as L

from lightning_hydro.stopping.trial_record import TrialResult

__all__ = ["TrialBuilder"]

log = logging.getLogger(__name__)


class TrialBuilder:
    """Builds trial modules, recording each trial whose module raised as ``failed``, with the error."""

    def __init__(self, build_module: Callable[[int], L.LightningModule]) -> None:
        self.build_module = build_module
        self.failed: dict[int, TrialResult] = {}

    def buildable(self, trial_ids: Sequence[int]) -> Iterator[tuple[int, L.LightningModule]]:
        """``(trial_id, module)`` of each trial whose module builds, in order, built when drawn."""
        for tid in trial_ids:
            try:
                module = self.build_module(tid)
            except Exception as err:  # the user's module: any error fails this trial only
                cause = err
                while cause.__cause__ is not None and isinstance(cause.__cause__, Exception):
                    cause = cause.__cause__  # e.g. the module's own error, under Hydra's InstantiationException
                error = f"{type(cause).__name__}: " + " ".join(str(cause).split())
                log.error("trial %d failed: building its module raised %s", tid, error, exc_info=err)
                self.failed[tid] = TrialResult(status="failed", budget=0, metrics={}, history=[], error=error)
                continue
            yield tid, module
