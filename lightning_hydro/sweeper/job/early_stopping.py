"""The early-stopping callback of a sweep job, built from ``hydra.sweeper.scheduler`` settings.

Example::

    >>> from lightning_hydro.sweeper.group_spec import EarlyStoppingSpec
    >>> spec = EarlyStoppingSpec(name="asha", metric="val_acc", mode="max", reduction_factor=3, grace_period=1)
    >>> callback = build_stopping_callback(spec, max_t=9)
    >>> type(callback).__name__, callback.monitor
    ('ASHA', 'val_acc')
"""

from __future__ import annotations

from typing import Any

import lightning as L

from lightning_hydro.callbacks.refill_source import RefillSpec
from lightning_hydro.stopping import RungStore
from lightning_hydro.sweeper.group_spec import EarlyStoppingSpec

__all__ = ["REFILLING", "SWEEP_TRIAL_PREFIX", "build_stopping_callback"]

SWEEP_TRIAL_PREFIX = "sweep"
"""Every group's callback names its trials ``"sweep/<trial_id>"`` in the shared store: sweep ids are unique."""

# Schedulers whose callback takes new trials into freed slots (synchronous successive halving cannot).
REFILLING = ("asha", "hyperband", "deadline")


def build_stopping_callback(
    spec: EarlyStoppingSpec, *, max_t: int, refill: RefillSpec | None = None, storage: RungStore | None = None
) -> L.Callback:
    """The callback for ``spec.name`` (``asha``, ``successive_halving``, ``hyperband`` or ``deadline``).

    ``spec.options`` go to the callback as keyword arguments (``deadline`` needs ``deadline``, in seconds).
    ``storage``: the sweep's shared rung store; its trials are then named ``"sweep/<trial_id>"`` there.

    Raises:
        ValueError: an unknown scheduler, a reduction factor that is not a whole number, ``deadline``
            without a deadline.
    """
    from lightning_hydro.callbacks import ASHA, Deadline, Hyperband, SuccessiveHalving

    classes: dict[str, type[L.Callback]] = {
        "asha": ASHA,
        "successive_halving": SuccessiveHalving,
        "hyperband": Hyperband,
        "deadline": Deadline,
    }
    if spec.name not in classes:
        raise ValueError(
            f"hydra.sweeper.scheduler.name={spec.name!r} has no early-stopping callback; expected one of "
            f"{sorted(classes)} (or none)."
        )
    if float(spec.reduction_factor) != int(spec.reduction_factor):
        raise ValueError(
            f"hydra.sweeper.scheduler.reduction_factor must be a whole number (budgets are whole epochs), got "
            f"{spec.reduction_factor}. Fix: e.g. hydra.sweeper.scheduler.reduction_factor=3."
        )
    if classes[spec.name] is Deadline and "deadline" not in spec.options:
        raise ValueError(
            f"hydra.sweeper.scheduler.name={spec.name} needs a deadline in seconds. Fix: "
            "+hydra.sweeper.scheduler.options.deadline=600."
        )
    kwargs: dict[str, Any] = dict(
        monitor=spec.metric,
        mode=spec.mode,
        grace_period=spec.grace_period,
        reduction_factor=int(spec.reduction_factor),
        max_t=max_t,
        **spec.options,
    )
    if refill is not None:
        kwargs["refill"] = refill
    if storage is not None:
        kwargs["storage"] = storage
        kwargs["trial_id"] = SWEEP_TRIAL_PREFIX
    return classes[spec.name](**kwargs)
