"""Checks and defaults shared by the callbacks: argument errors, storage, the trial's id, an unlogged monitor."""

from __future__ import annotations

import uuid

import lightning as L

from lightning_hydro.stopping import RungStore, StoreOpenError, StoreSpec, open_store

__all__ = [
    "MonitorNotLoggedError",
    "check_arguments",
    "check_steps_limit",
    "default_trial_id",
    "hydra_job_number",
    "monitor_error",
    "open_storage",
    "resolve_max_t",
]


def check_arguments(
    name: str,
    monitor: object,
    mode: object,
    grace_period: object,
    reduction_factor: object,
    max_t: object,
    time_attr: object,
    namespace: object,
    trial_id: object,
) -> None:
    """Raise, naming the callback ``name``, the argument, what came and how to fix it, for invalid settings."""
    if not isinstance(monitor, str) or not monitor:
        raise ValueError(f"{name}: monitor must be the name of a logged metric, e.g. 'val_loss', got {monitor!r}.")
    if mode not in ("min", "max"):
        raise ValueError(
            f"{name}: mode must be 'min' or 'max', got {mode!r}. Use mode='min' when a lower {monitor} is better "
            "(a loss) and mode='max' when a higher one is better (an accuracy)."
        )
    _check_integer(name, "reduction_factor", reduction_factor)
    assert isinstance(reduction_factor, int)
    if reduction_factor <= 1:
        raise ValueError(
            f"{name}: reduction_factor must be an integer >= 2, got {reduction_factor}. Each rung keeps about "
            "1/reduction_factor of the trials it judges; use 2, 3 (the usual choice) or 4."
        )
    _check_integer(name, "grace_period", grace_period)
    assert isinstance(grace_period, int)
    if grace_period < 1:
        raise ValueError(
            f"{name}: grace_period must be >= 1, got {grace_period}. It is the budget every trial trains before it "
            "is first judged; use grace_period=1 or more."
        )
    if max_t is not None:
        _check_integer(name, "max_t", max_t)
        assert isinstance(max_t, int)
        if grace_period > max_t:
            raise ValueError(
                f"{name}: grace_period={grace_period} is greater than max_t={max_t}, so no trial would ever be "
                "judged. Lower grace_period or raise max_t."
            )
    if time_attr not in ("epochs", "steps"):
        raise ValueError(
            f"{name}: time_attr must be 'epochs' or 'steps', got {time_attr!r}: the unit in which grace_period and "
            "max_t count each trial's training."
        )
    if not isinstance(namespace, str) or not namespace:
        raise ValueError(f"{name}: namespace must be a non-empty string naming the sweep, got {namespace!r}.")
    if trial_id is not None and (isinstance(trial_id, bool) or not isinstance(trial_id, int | str)):
        raise TypeError(f"{name}: trial_id must be an int, a str or None, got {type(trial_id).__name__}.")


def _check_integer(name: str, argument: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name}: {argument} must be an integer number of epochs or steps, got {type(value).__name__} {value!r}."
            if argument != "reduction_factor"
            else f"{name}: reduction_factor must be an integer >= 2, got {type(value).__name__} {value!r}."
        )


def open_storage(owner: str, spec: StoreSpec, namespace: str) -> RungStore:
    """:func:`~lightning_hydro.stopping.open_store`, its errors prefixed with the callback's name."""
    try:
        return open_store(spec, namespace=namespace)
    except StoreOpenError as error:
        raise StoreOpenError(f"{owner}: cannot use this storage: {error}") from error
    except TypeError as error:
        raise TypeError(f"{owner}: storage: {error}") from error


def hydra_job_number() -> int | None:
    """The job number of the running Hydra multirun job, or None outside one."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from omegaconf.errors import OmegaConfBaseException
    except ImportError:
        return None
    if not HydraConfig.initialized():
        return None
    try:
        number = HydraConfig.get().job.num
    except OmegaConfBaseException:  # a single run: no job number
        return None
    return None if number is None else int(number)


def default_trial_id() -> str:
    """``"job{n}"`` in a Hydra multirun job, else a random id."""
    number = hydra_job_number()
    return f"job{number}" if number is not None else uuid.uuid4().hex[:12]


def resolve_max_t(name: str, max_t: int | None, grace_period: int, time_attr: str, trainer: L.Trainer) -> int:
    """``max_t``, or the Trainer's ``max_epochs`` / ``max_steps`` when it is None; raise if no trial could reach it."""
    limit, limit_name = (
        (trainer.max_epochs, "max_epochs") if time_attr == "epochs" else (trainer.max_steps, "max_steps")
    )
    bounded = limit is not None and limit >= 0
    if max_t is None:
        if limit is None or not bounded:
            raise ValueError(
                f"{name}: max_t is not set and the Trainer has no {limit_name} limit, so no budget would mark a "
                f"trial complete. Pass max_t=..., e.g. {name}(..., max_t=27)."
            )
        if limit < grace_period:
            raise ValueError(
                f"{name}: max_t defaults to the Trainer's {limit_name}={limit}, which is below "
                f"grace_period={grace_period}: no trial would ever be judged. Lower grace_period or raise {limit_name}."
            )
        return int(limit)
    if bounded and limit is not None and max_t > limit:
        raise ValueError(
            f"{name}: max_t={max_t} {time_attr} is beyond the Trainer's {limit_name}={limit}, so no trial could "
            f"reach max_t. Lower max_t to at most {limit}, or raise the Trainer's {limit_name}."
        )
    return max_t


def check_steps_limit(name: str, max_t: int, trainer: L.Trainer) -> None:
    """Raise if ``max_t`` steps are more than the optimizer steps the Trainer will take."""
    limit = trainer.estimated_stepping_batches
    if limit != float("inf") and max_t > limit:
        raise ValueError(
            f"{name}: max_t={max_t} steps is beyond the {int(limit)} optimizer steps this Trainer will take "
            "(max_steps, or max_epochs times the batches per epoch), so no trial could reach max_t. Lower max_t to "
            f"at most {int(limit)}, or train longer."
        )


class MonitorNotLoggedError(RuntimeError):
    """An early-stopping callback's ``monitor`` is not logged; ``monitor``, ``logged`` and ``when`` say what was seen.

    The sweeper, whose ``hydra.sweeper.metric`` is the monitor of the callback it builds, restates it in its terms.
    """

    def __init__(self, message: str, *, monitor: str, logged: list[str], when: str) -> None:
        super().__init__(message)
        self.monitor = monitor
        self.logged = list(logged)
        self.when = when


def monitor_error(
    owner: str, monitor: str, trainer: L.Trainer, logged: list[str], *, per_trial: bool, when: str | None = None
) -> MonitorNotLoggedError:
    """The error for a ``monitor`` the trials do not log: what is logged instead, and the fix."""
    where = "by any trial of the fused module" if per_trial else "in trainer.callback_metrics"
    shown = ", ".join(repr(name) for name in logged) if logged else "nothing"
    first = "validation" if trainer.enable_validation else "training epoch"
    when_text = f"after {when}" if when else f"at the end of the first {first}"
    hint = (
        " Pass the name the trial modules give self.log, without the '/trial_{id}' suffix."
        if per_trial
        else " Pass one of these, or log the metric in validation_step (or training_step without validation)."
    )
    return MonitorNotLoggedError(
        f"{owner}(monitor={monitor!r}): the monitor is not logged {where} {when_text}; logged: {shown}.{hint}",
        monitor=monitor,
        logged=logged,
        when=when_text,
    )
