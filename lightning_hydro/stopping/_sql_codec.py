"""How the SQL stores write trial ids and values, which SQL columns cannot hold as Python does."""

from __future__ import annotations

import json
import math
from typing import Any

from lightning_hydro.stopping.halving_config import TrialId
from lightning_hydro.stopping.rung_record import RungRecord

RECORDS_TABLE = "lightning_hydro_rung_records"
SETTINGS_TABLE = "lightning_hydro_rung_settings"
LOCKS_TABLE = "lightning_hydro_rung_locks"


def encode_trial_id(trial_id: TrialId) -> str:
    """JSON text, so that the int 3 and the str "3" stay different trials."""
    return json.dumps(trial_id)


def decode_trial_id(text: str) -> TrialId:
    """The inverse of :func:`encode_trial_id`."""
    trial_id: TrialId = json.loads(text)
    return trial_id


def encode_value(value: float) -> float | None:
    """NULL for NaN (SQL has no NaN); infinities are stored as they are."""
    return None if math.isnan(value) else value


def decode_value(value: float | None) -> float:
    """NULL back to NaN; every non-finite value means a diverged trial anyway."""
    return math.nan if value is None else float(value)


def record_from_row(row: Any) -> RungRecord:
    """A record from a ``(sequence, trial_id, bracket, milestone, budget, value)`` row."""
    sequence, trial_id, bracket, milestone, budget, value = row
    return RungRecord(
        trial_id=decode_trial_id(trial_id),
        bracket=int(bracket),
        milestone=int(milestone),
        budget=int(budget),
        value=decode_value(value),
        sequence=int(sequence),
    )
