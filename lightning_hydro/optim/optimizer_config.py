"""Read what a trial module's ``configure_optimizers()`` returned, in any of Lightning's formats.

A fused group steps each trial's own optimizer and LR schedulers, so their configuration is read per
trial, with Lightning's semantics: ``interval`` (step or epoch), ``frequency``, ``monitor`` for
``ReduceLROnPlateau``, ``strict`` and ``name``.

Example::

    >>> import torch
    >>> model = torch.nn.Linear(2, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    >>> parsed = parse_optimizer_config({"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}},
    ...                                 trial_id=0)
    >>> parsed.optimizer is opt, parsed.schedulers[0].interval
    (True, 'step')
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau

__all__ = ["SchedulerSpec", "TrialOptimization", "parse_optimizer_config"]

_SCHEDULER_KEYS = {"scheduler", "name", "interval", "frequency", "reduce_on_plateau", "monitor", "strict"}


@dataclass
class SchedulerSpec:
    """One LR scheduler of a trial, with Lightning's stepping configuration."""

    scheduler: Any
    interval: Literal["step", "epoch"] = "epoch"
    frequency: int = 1
    monitor: str | None = None
    strict: bool = True
    name: str | None = None
    reduce_on_plateau: bool = False


@dataclass
class TrialOptimization:
    """A trial's optimizer(s) and its LR schedulers.

    ``optimizer`` is the first optimizer ``configure_optimizers()`` returned (under automatic optimization, the
    only one); ``more_optimizers`` the others, in order (manual optimization, e.g. a GAN's discriminator's).
    """

    optimizer: Optimizer
    schedulers: list[SchedulerSpec] = field(default_factory=list)
    more_optimizers: list[Optimizer] = field(default_factory=list)

    @property
    def optimizers(self) -> list[Optimizer]:
        """Every optimizer of the trial, in ``configure_optimizers()``'s order."""
        return [self.optimizer, *self.more_optimizers]


class OptimizerConfigError(ValueError):
    """A trial's ``configure_optimizers()`` returned something a fused group cannot step."""


def _scheduler_spec(entry: Any, monitor: str | None, trial_id: int) -> SchedulerSpec:
    if isinstance(entry, Mapping):
        unknown = set(entry) - _SCHEDULER_KEYS
        if unknown:
            raise OptimizerConfigError(
                f"Trial {trial_id}: the lr scheduler dict has unsupported keys {sorted(unknown)}; "
                f"allowed keys are {sorted(_SCHEDULER_KEYS)}."
            )
        if "scheduler" not in entry:
            raise OptimizerConfigError(
                f"Trial {trial_id}: the lr scheduler dict must have the key 'scheduler' holding an LR scheduler."
            )
        interval = entry.get("interval", "epoch")
        if interval not in ("step", "epoch"):
            raise OptimizerConfigError(
                f"Trial {trial_id}: the lr scheduler 'interval' must be 'step' or 'epoch', got {interval!r}."
            )
        frequency = int(entry.get("frequency", 1))
        if frequency < 1:
            raise OptimizerConfigError(f"Trial {trial_id}: lr scheduler 'frequency' must be >= 1, got {frequency}.")
        scheduler = entry["scheduler"]
        spec = SchedulerSpec(
            scheduler=scheduler,
            interval=interval,
            frequency=frequency,
            monitor=entry.get("monitor", monitor),
            strict=bool(entry.get("strict", True)),
            name=entry.get("name"),
            reduce_on_plateau=bool(entry.get("reduce_on_plateau", isinstance(scheduler, ReduceLROnPlateau))),
        )
    else:
        spec = SchedulerSpec(scheduler=entry, monitor=monitor, reduce_on_plateau=isinstance(entry, ReduceLROnPlateau))
    if spec.reduce_on_plateau and spec.monitor is None:
        raise OptimizerConfigError(
            f"Trial {trial_id}: a ReduceLROnPlateau scheduler needs a metric to monitor; return "
            "{'optimizer': opt, 'lr_scheduler': {'scheduler': sched, 'monitor': 'val_loss'}} from "
            "configure_optimizers()."
        )
    if not hasattr(spec.scheduler, "step"):
        raise OptimizerConfigError(
            f"Trial {trial_id}: {type(spec.scheduler).__name__} is not an LR scheduler (it has no step() method)."
        )
    return spec


def _split(config: Any, trial_id: int) -> tuple[list[Any], list[Any], str | None]:
    """(optimizers, schedulers, monitor) for every return format Lightning documents."""
    if isinstance(config, Optimizer):
        return [config], [], None
    if isinstance(config, Mapping):
        if "optimizer" not in config:
            raise OptimizerConfigError(
                f"Trial {trial_id}: a dict returned by configure_optimizers() needs an 'optimizer' key, "
                f"got keys {sorted(config)}."
            )
        schedulers = [config["lr_scheduler"]] if config.get("lr_scheduler") is not None else []
        return [config["optimizer"]], schedulers, config.get("monitor")
    if isinstance(config, Sequence) and not isinstance(config, str):
        items = list(config)
        if len(items) == 2 and isinstance(items[0], Sequence) and not isinstance(items[0], Mapping):
            schedulers = list(items[1]) if isinstance(items[1], Sequence) else [items[1]]
            return list(items[0]), schedulers, None
        if items and all(isinstance(item, Mapping) for item in items):
            optimizers: list[Any] = []
            schedulers = []
            monitor = None
            for item in items:
                opts, scheds, monitor = _split(item, trial_id)
                optimizers += opts
                schedulers += scheds
            return optimizers, schedulers, monitor
        return items, [], None
    raise OptimizerConfigError(
        f"Trial {trial_id}: configure_optimizers() returned {type(config).__name__}, which is not one of "
        "Lightning's formats (an optimizer; a list of optimizers; ([optimizers], [schedulers]); a dict with "
        "'optimizer' and optionally 'lr_scheduler' and 'monitor')."
    )


def parse_optimizer_config(
    config: Any, *, trial_id: int, module: nn.Module | None = None, manual: bool = False
) -> TrialOptimization:
    """Normalise one trial's ``configure_optimizers()`` output.

    Args:
        config: what ``configure_optimizers()`` returned.
        trial_id: the trial, for error messages.
        module: if given, every optimized parameter must belong to it (a fused group can only step a
            trial's own parameters).
        manual: the trial uses manual optimization (``automatic_optimization = False``): it may return several
            optimizers, which its ``training_step`` steps itself (as Lightning requires for several optimizers).

    Raises:
        OptimizerConfigError: no optimizer, several optimizers under automatic optimization, a malformed
            scheduler entry, or foreign parameters.
    """
    if config is None:
        raise OptimizerConfigError(
            f"Trial {trial_id}: configure_optimizers() returned None; a fused trial needs an optimizer to train."
        )
    optimizers, schedulers, monitor = _split(config, trial_id)
    named = ", ".join(type(o).__name__ for o in optimizers) or "none"
    if not optimizers or not all(isinstance(o, Optimizer) for o in optimizers):
        raise OptimizerConfigError(
            f"Trial {trial_id}: configure_optimizers() must return torch optimizers for a fused trial, got "
            f"{len(optimizers)} ({named})."
        )
    if len(optimizers) != 1 and not manual:
        raise OptimizerConfigError(
            f"Trial {trial_id}: configure_optimizers() returned {len(optimizers)} optimizers ({named}) under "
            "automatic optimization, which steps exactly one. Several optimizers need manual optimization, as "
            "in Lightning itself: set self.automatic_optimization = False in the module's __init__ and step "
            "them in training_step (opt_a, opt_b = self.optimizers(); self.manual_backward(loss); opt_a.step())."
        )
    needs_closure = [type(o).__name__ for o in optimizers if _step_needs_closure(o)]
    if needs_closure and not manual:
        raise OptimizerConfigError(
            f"Trial {trial_id}: {needs_closure[0]}.step needs a closure that re-evaluates the trial's loss (as "
            "LBFGS's line search does), which a fused group's one forward/backward for every trial cannot give "
            "each trial. Use manual optimization, where each trial's own closure runs (on the loop backend): set "
            "self.automatic_optimization = False and, in training_step, opt = self.optimizers(); "
            "opt.step(closure) with a closure that computes the loss, zeroes the gradients, calls "
            "self.manual_backward(loss) and returns the loss."
        )
    if module is not None:
        own = {id(p) for p in module.parameters()}
        foreign = sum(1 for o in optimizers for g in o.param_groups for p in g["params"] if id(p) not in own)
        if foreign:
            raise OptimizerConfigError(
                f"Trial {trial_id}: its optimizer holds {foreign} parameter(s) that do not belong to the trial "
                "module; build the optimizer from self.parameters() (or a subset of them)."
            )
    specs = [_scheduler_spec(entry, monitor, trial_id) for entry in schedulers]
    for spec in specs:
        owner = getattr(spec.scheduler, "optimizer", optimizers[0])
        if not any(owner is o for o in optimizers):
            raise OptimizerConfigError(
                f"Trial {trial_id}: an LR scheduler is attached to an optimizer that configure_optimizers() "
                "did not return."
            )
    return TrialOptimization(optimizer=optimizers[0], schedulers=specs, more_optimizers=list(optimizers[1:]))


def _step_needs_closure(optimizer: Optimizer) -> bool:
    """Whether the optimizer's ``step`` cannot run without a closure (``torch.optim.LBFGS``)."""
    try:
        closure = inspect.signature(type(optimizer).step).parameters.get("closure")
    except (TypeError, ValueError):  # a step without a signature Python can read: assume the usual optional closure
        return False
    return closure is not None and closure.default is inspect.Parameter.empty
