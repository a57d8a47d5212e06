"""``Deadline``: ASHA that plans for a deadline (HyperSched, Liaw et al., SoCC 2019)."""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
from typing_extensions import override

from lightning_hydro.callbacks.asha import ASHA
from lightning_hydro.callbacks.halving_callback import TimeAttr
from lightning_hydro.callbacks.refill_source import RefillSpec
from lightning_hydro.callbacks.trial_ending import TrialEnding
from lightning_hydro.stopping import (
    DeadlinePolicy,
    LinearCost,
    Mode,
    StoreSpec,
    TrialId,
    TrialProgress,
)
from lightning_hydro.stopping.deadline_policy import SecondsPerUnit

__all__ = ["Deadline"]

_KEPT_MEASUREMENTS = 64


class Deadline(ASHA):
    """ASHA plus a deadline: start no trial that cannot finish, and near the deadline let the best trials finish.

    Every decision of :class:`~lightning_hydro.callbacks.asha.ASHA` applies. In addition, at each decision point
    the callback measures how long the group takes per epoch (or step) at its current size, fits the cost of a
    group of ``B`` trials (``fixed + per_trial * B``, see :class:`~lightning_hydro.stopping.LinearCost`) and asks
    :class:`~lightning_hydro.stopping.DeadlinePolicy`:

    - **Pruning.** Keep, from the best trial down, the trials that can still all reach the top rung (the last
      milestone) before the deadline in a group of their size; stop the others (reason "cannot reach the top rung
      before the deadline"), so that the survivors step faster in the freed capacity. The best trial is never
      stopped for lack of time.
    - **Admission.** Refill a free slot only if a new trial could reach the top rung in time alongside the kept
      ones; near the deadline the group just shrinks.
    - **The deadline itself.** When it passes, training stops (checked after every batch) and the trials still
      running are stopped with reason "deadline reached".

    With one trial per process, the first decision (after one measured epoch or step) stops a trial that cannot
    reach the top rung before the deadline; the deadline should then be a wall-clock ``datetime`` shared by all
    processes.

    Takes every argument of :class:`~lightning_hydro.callbacks.asha.ASHA`, and:

    Args:
        deadline: Seconds (a number or a ``timedelta``) from the start of training, or a wall-clock ``datetime``
            (naive means local time). A resumed run keeps the deadline of the run it resumes.
        clock: Returns the current time in seconds since the epoch (default :func:`time.time`); tests and
            simulations pass their own.

    Attributes:
        measurements: ``(group size, seconds per unit of budget)`` measured between decision points.

    Raises:
        ValueError: As :class:`~lightning_hydro.callbacks.asha.ASHA`, and for a deadline that is not a positive
            duration or lies in the past.

    Example::

        >>> import lightning as L
        >>> from lightning_hydro import FusedLightningModule
        >>> from lightning_hydro.demos import DigitsDataModule, DigitsMLP
        >>> trials = [DigitsMLP(hidden_dim=16, lr=0.02 * (i + 1)) for i in range(4)]
        >>> deadline = Deadline(monitor="val_loss", deadline=600.0, max_t=2)   # 10 minutes from the start of fit
        >>> trainer = L.Trainer(max_epochs=2, callbacks=[deadline], logger=False, enable_progress_bar=False,
        ...                     enable_checkpointing=False, enable_model_summary=False, limit_train_batches=4)
        >>> trainer.fit(FusedLightningModule(trials, backend="vmap", summary=False), datamodule=DigitsDataModule())
        >>> deadline.time_left() > 0, len(deadline.measurements) >= 1
        (True, True)
    """

    def __init__(
        self,
        monitor: str,
        mode: Mode = "min",
        *,
        deadline: float | datetime.timedelta | datetime.datetime,
        grace_period: int = 1,
        reduction_factor: int = 3,
        max_t: int | None = None,
        time_attr: TimeAttr = "epochs",
        refill: RefillSpec | None = None,
        storage: StoreSpec = None,
        namespace: str = "default",
        trial_id: TrialId | None = None,
        clock: Callable[[], float] = time.time,
        verbose: bool = False,
    ) -> None:
        super().__init__(
            monitor,
            mode,
            grace_period=grace_period,
            reduction_factor=reduction_factor,
            max_t=max_t,
            time_attr=time_attr,
            refill=refill,
            storage=storage,
            namespace=namespace,
            trial_id=trial_id,
            verbose=verbose,
        )
        if not callable(clock):
            raise TypeError(f"Deadline: clock must be a function returning seconds, got {type(clock).__name__}.")
        self.clock = clock
        self.deadline = deadline
        self._duration_s, self._wall_clock_at = _parse_deadline(deadline, clock())
        self.measurements: list[tuple[int, float]] = []
        self._deadline_at: float | None = None
        self._interval: tuple[float, int, int] | None = None  # (time, units done, group size) at its start
        self._admission_checked = False
        self._deadline_passed = False
        self._values: dict[TrialId, float | None] = {}  # the monitored values of the last decision

    def time_left(self) -> float:
        """Seconds until the deadline (``inf`` before training starts a relative deadline)."""
        if self._deadline_at is None:
            return math.inf if self._wall_clock_at is None else self._wall_clock_at - self.clock()
        return self._deadline_at - self.clock()

    def seconds_per_unit(self) -> SecondsPerUnit | None:
        """The fitted cost of one unit of budget (epoch or step) for a group of ``B`` trials; None before any."""
        if not self.measurements:
            return None
        line = LinearCost.fit(self.measurements)
        return line if line.predict(1) > 0 else None

    # -- hooks ------------------------------------------------------------------------------------------------

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.measurements, self._deadline_at, self._interval, self._values = [], None, None, {}
        self._admission_checked, self._deadline_passed = False, False
        super().setup(trainer, pl_module, stage)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._deadline_at is None:
            if self._wall_clock_at is not None:
                self._deadline_at = self._wall_clock_at
            elif self._duration_s is not None:
                self._deadline_at = self.clock() + self._duration_s
        super().on_train_start(trainer, pl_module)
        self._start_interval()  # a resumed run does not count the time it was down

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self._on_rank_zero(trainer, lambda: self.time_left() <= 0):
            self._deadline_passed = True
            trainer.should_stop = True

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "deadline": {
                "deadline_at": self._deadline_at,
                "measurements": [list(m) for m in self.measurements],
                "admission_checked": self._admission_checked,
                "deadline_passed": self._deadline_passed,
            },
        }

    # -- decisions ----------------------------------------------------------------------------------------------

    @override
    def _decide(self, trainer: L.Trainer, pl_module: L.LightningModule, *, epoch_end: bool) -> None:
        super()._decide(trainer, pl_module, epoch_end=epoch_end)
        self._start_interval()

    @override
    def _extra_stops(self, values: Mapping[TrialId, float | None], stopping: set[TrialId]) -> list[TrialEnding]:
        self._measure()
        self._values = dict(values)
        live = [progress for progress in self._progress() if progress.trial_id not in stopping]
        if self.time_left() <= 0:
            self._deadline_passed = True
            return [TrialEnding(p.trial_id, "stopped", p.budget, "deadline reached", value=p.value) for p in live]
        speed = self.seconds_per_unit()
        if speed is None or not live:
            return []
        policy = DeadlinePolicy(self._config)
        if not self._trials.together:  # one trial per process: can it finish? (asked once)
            if self._admission_checked:
                return []
            self._admission_checked = True
            (trial,) = live
            if policy.seconds_to_top_rung(trial.budget, speed) <= self.time_left():
                return []
            return [self._cannot_finish(trial)]
        plan = policy.plan(live, self.time_left(), speed)
        return [self._cannot_finish(p) for p in live if p.trial_id not in plan.keep]

    @override
    def _admissions(self, free_slots: int) -> int:
        if self.time_left() <= 0:
            return 0
        speed = self.seconds_per_unit()
        if speed is None:
            return free_slots  # nothing measured yet: the first group starts full
        policy = DeadlinePolicy(self._config)
        kept = self._progress()
        admitted = 0
        while admitted < free_slots:
            newcomers = [TrialProgress(f"<new {index}>", 0) for index in range(admitted)]
            if not policy.plan([*kept, *newcomers], self.time_left(), speed).admit_new_trials:
                break
            admitted += 1
        return admitted

    @override
    def _end_reason(self, budget: int) -> str:
        if self._deadline_passed:
            return f"deadline reached at {budget} {self.time_attr}"
        return super()._end_reason(budget)

    @override
    def _restore(self, state: Mapping[str, Any]) -> None:
        super()._restore(state)
        saved = state["deadline"]
        self._deadline_at = saved["deadline_at"]
        self.measurements = [(int(size), float(seconds)) for size, seconds in saved["measurements"]]
        self._admission_checked = bool(saved["admission_checked"])
        self._deadline_passed = bool(saved["deadline_passed"])

    # -- helpers -----------------------------------------------------------------------------------------------

    def _cannot_finish(self, trial: TrialProgress) -> TrialEnding:
        reason = "cannot reach the top rung before the deadline"
        return TrialEnding(trial.trial_id, "stopped", trial.budget, reason, value=trial.value)

    def _progress(self) -> list[TrialProgress]:
        """Each running trial's budget and the monitored value the last decision saw (new trials: none)."""
        view = self._trials
        return [TrialProgress(tid, view.budget(tid), self._values.get(tid)) for tid in view.running()]

    def _start_interval(self) -> None:
        view = self._trials
        self._interval = (self.clock(), view.units_done(), len(view.running()))

    def _measure(self) -> None:
        if self._interval is None:
            return
        started, units_before, size = self._interval
        units = self._trials.units_done() - units_before
        elapsed = self.clock() - started
        if units > 0 and size > 0 and elapsed > 0:
            self.measurements = [*self.measurements, (size, elapsed / units)][-_KEPT_MEASUREMENTS:]


def _parse_deadline(deadline: object, now: float) -> tuple[float | None, float | None]:
    """``(seconds from the start of training, None)`` or ``(None, wall-clock timestamp)``."""
    if isinstance(deadline, datetime.datetime):
        at = deadline.timestamp()
        if at <= now:
            raise ValueError(
                f"Deadline: the deadline {deadline.isoformat()} is in the past. Pass a later time, or a duration in "
                "seconds (e.g. deadline=3600 for one hour from the start of training)."
            )
        return None, at
    seconds = deadline.total_seconds() if isinstance(deadline, datetime.timedelta) else deadline
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            f"Deadline: deadline must be a duration > 0 (seconds or a timedelta) or a datetime, got {deadline!r}. "
            "E.g. deadline=3600 stops training one hour after it starts."
        )
    return float(seconds), None
