"""The unit of rung storage: one trial's value at one rung milestone."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lightning_hydro.stopping.halving_config import TrialId


@dataclass(frozen=True)
class RungEntry:
    """A value to record: ``trial_id`` reached the rung ``milestone`` of ``bracket`` at ``budget``.

    Attributes:
        trial_id: The trial.
        bracket: Which Hyperband bracket's rungs (0 for plain ASHA); rungs of different brackets never mix.
        milestone: The rung's budget (``grace_period * eta**k``); together with ``bracket`` it names the rung.
        budget: The budget the trial had when it reported (>= ``milestone``, e.g. if it is validated every
            few epochs).
        value: The monitored value (NaN or infinite for a diverged trial).

    Example::

        >>> RungEntry("a", bracket=0, milestone=3, budget=4, value=0.25).rung_key
        (0, 3)
    """

    trial_id: TrialId
    bracket: int
    milestone: int
    budget: int
    value: float

    @property
    def rung_key(self) -> tuple[int, int]:
        """``(bracket, milestone)``: the rung this entry belongs to."""
        return (self.bracket, self.milestone)


@dataclass(frozen=True)
class RungRecord(RungEntry):
    """A stored :class:`RungEntry` with its place in the arrival order.

    Attributes:
        sequence: Position in the store's arrival order (increasing across all rungs and processes);
            decisions depend only on which records came before.

    Example::

        >>> record = RungRecord("a", bracket=0, milestone=1, budget=1, value=0.5, sequence=4)
        >>> RungRecord.from_dict(record.to_dict()) == record
        True
    """

    sequence: int

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (for ``state_dict``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RungRecord:
        """The inverse of :meth:`to_dict`."""
        return cls(**data)
