"""``TrialStrategyView``: the Trainer's strategy as one fused trial sees it, so Lightning's accessors answer per trial.

A LightningModule reaches its optimizers through its Trainer's strategy: ``self.optimizers()`` returns
``trainer.strategy._lightning_optimizers`` (``LightningOptimizer`` wrappers), ``self.manual_backward(loss)``
calls ``trainer.strategy.backward``, and a wrapper's ``step()`` calls ``trainer.strategy.optimizer_step``. In a
fused group the real strategy holds the group's one optimizer, so a trial's :class:`~.trainer_view.TrialTrainerView`
answers ``strategy`` with this view: the trial's own optimizers, wrapped as Lightning wraps them (``param_groups``
with the trial's ``lr``, ``momentum``..., writable: the group's update reads them at every step), its backward and
optimizer steps run through Lightning's precision plugin with the trial module (so the trial's
``on_before_backward`` / ``on_after_backward`` / ``on_before_optimizer_step`` hooks run as they do alone), guarded
for divergence under manual optimization (:mod:`lightning_hydro.fused.step.manual_steps`). Everything else is the
real strategy's.

Under vmap and hfta one call of the user's step runs every trial at once, with one module's Python code: there a
trial's optimizers cannot be told apart, and reading them raises a :class:`~lightning_hydro.backends.FusionError`
(``backend="auto"`` then runs the group on the loop, which answers per trial); the hooks outside the step
(``on_train_epoch_start`` ...) run per trial on every backend and always get the trial's own.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import lightning as L
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.utilities.types import LRSchedulerConfig
from torch import Tensor
from torch.optim import Optimizer

from lightning_hydro.backends.errors import FusionError, package_dir

if TYPE_CHECKING:
    from lightning_hydro.fused.step.manual_steps import ManualSteps
    from lightning_hydro.optim.optimizer_config import TrialOptimization

__all__ = ["TrialOptimizerSource", "TrialStrategyView", "refuse_inside_vmap", "scheduler_configs_of"]

_OWN = ("_strategy", "_trial", "_trial_id", "_source", "_wrapped")


class TrialOptimizerSource(Protocol):
    """Where a trial's view finds its optimizers (the fused module's ``TrialOptimizers``)."""

    @property
    def manual_steps(self) -> ManualSteps | None:
        """The guard of manual-optimization steps, for a group whose trials use manual optimization."""

    def optimization(self, trial_id: int) -> TrialOptimization | None:
        """The trial's optimizers and schedulers (None before Lightning asked for them, or once it left)."""

    def group_size(self) -> int:
        """How many trials the group runs now."""

    def checkpoint_states(
        self, trial_id: int, clone: Callable[[Any], Any]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        """Copies of the trial's optimizer and LR scheduler states, for its own checkpoint (None: it has none)."""


# Frames under these directories are library code, not the user's.
_LIBRARY_DIRS = tuple(
    d
    for d in (
        # lightning_hydro/ (this file is lightning_hydro/fused/lightning/strategy_view.py)
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep,
        package_dir("torch"),
        package_dir("lightning"),
    )
    if d
)


def _user_line() -> str:
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(_LIBRARY_DIRS) and "<" not in frame.filename:
            code = f": {frame.line.strip()}" if frame.line else ""
            return f"{frame.filename}:{frame.lineno} in {frame.name}{code}"
    return "unknown location"


def refuse_inside_vmap(source: TrialOptimizerSource, what: str) -> None:
    """Raise a ``FusionError`` if a vectorised call of every trial's code (vmap, hfta) asks for ``what``.

    A trial's optimizers and schedulers are Python objects, one per trial, whose values (``lr``...) differ; one
    call of the code for all trials cannot get each trial's own. A group of one trial has nothing to tell apart.
    """
    # torch has no public "inside torch.func.vmap?"; the fused backends run the user's step under vmap only
    if not torch._C._are_functorch_transforms_active() or source.group_size() <= 1:
        return
    raise FusionError(
        f"{what} is read in the step at {_user_line()}; under vmap and hfta one call runs the step of every "
        "trial with one module's Python code, so it cannot answer with each trial's own optimizers and "
        "schedulers. Use backend='loop' (backend='auto' does so by itself), or read them in a hook "
        "(on_train_batch_start, on_train_epoch_start, ...), which runs per trial on every backend."
    )


def scheduler_configs_of(optimization: TrialOptimization | None) -> list[LRSchedulerConfig]:
    """The trial's LR schedulers with the configuration its ``configure_optimizers`` returned (unfused names)."""
    if optimization is None:
        return []
    return [
        LRSchedulerConfig(
            scheduler=spec.scheduler,
            name=spec.name,
            interval=spec.interval,
            frequency=spec.frequency,
            reduce_on_plateau=spec.reduce_on_plateau,
            monitor=spec.monitor,
            strict=spec.strict,
        )
        for spec in optimization.schedulers
    ]


class TrialStrategyView:
    """The real strategy as one trial sees it (see the module docstring).

    Args:
        strategy: the Trainer's strategy.
        trial: the trial module.
        trial_id: the trial's id.
        source: where the trial's optimizers are kept.
    """

    _strategy: Any
    _trial: L.LightningModule
    _trial_id: int
    _source: TrialOptimizerSource
    _wrapped: dict[int, tuple[Optimizer, LightningOptimizer]]

    def __init__(self, strategy: Any, trial: L.LightningModule, trial_id: int, source: TrialOptimizerSource) -> None:
        object.__setattr__(self, "_strategy", strategy)
        object.__setattr__(self, "_trial", trial)
        object.__setattr__(self, "_trial_id", trial_id)
        object.__setattr__(self, "_source", source)
        object.__setattr__(self, "_wrapped", {})

    @property
    def lightning_module(self) -> L.LightningModule:
        """The trial module."""
        return self._trial

    @property
    def model(self) -> L.LightningModule:
        """The trial module (unwrapped: one device)."""
        return self._trial

    @property
    def optimizers(self) -> list[Optimizer]:
        """The trial's own optimizers, in its ``configure_optimizers()``'s order."""
        refuse_inside_vmap(self._source, "self.trainer.optimizers")
        optimization = self._source.optimization(self._trial_id)
        return [] if optimization is None else optimization.optimizers

    @property
    def _lightning_optimizers(self) -> list[LightningOptimizer]:
        """What ``self.optimizers()`` returns: the trial's optimizers wrapped as Lightning wraps them."""
        refuse_inside_vmap(self._source, "self.optimizers()")
        optimization = self._source.optimization(self._trial_id)
        return [] if optimization is None else [self._wrap(o) for o in optimization.optimizers]

    @property
    def lr_scheduler_configs(self) -> list[LRSchedulerConfig]:
        """The trial's own LR schedulers (``self.lr_schedulers()`` returns them)."""
        refuse_inside_vmap(self._source, "self.lr_schedulers()")
        return scheduler_configs_of(self._source.optimization(self._trial_id))

    def _wrap(self, optimizer: Optimizer) -> LightningOptimizer:
        known = self._wrapped.get(id(optimizer))
        if known is None or known[0] is not optimizer:
            # the weak reference Lightning keeps to its strategy reaches this view, which the trainer view holds
            known = (optimizer, LightningOptimizer._to_lightning_optimizer(optimizer, self))  # type: ignore[arg-type]
            self._wrapped[id(optimizer)] = known
        return known[1]

    def backward(self, closure_loss: Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> Tensor:
        """``self.manual_backward(loss)``: Lightning's precision backward of the trial (its hooks run)."""
        refuse_inside_vmap(self._source, "self.manual_backward(loss)")
        precision = self._strategy.precision_plugin
        closure_loss = precision.pre_backward(closure_loss, self._trial)
        steps = self._source.manual_steps
        if steps is not None:
            steps.check_loss(self._trial_id, closure_loss)
        precision.backward(closure_loss, self._trial, optimizer, *args, **kwargs)
        return precision.post_backward(closure_loss, self._trial)

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        """A trial optimizer's ``step()``: Lightning's precision step with the trial module, guarded per trial."""
        refuse_inside_vmap(self._source, "opt.step()")
        precision = self._strategy.precision_plugin

        def step(guarded: Callable[[], Any]) -> Any:
            return precision.optimizer_step(optimizer, model=self._trial, closure=guarded, **kwargs)

        steps = self._source.manual_steps
        return step(closure) if steps is None else steps.optimizer_step(self._trial_id, optimizer, closure, step)

    def __getattr__(self, name: str) -> Any:
        if name in _OWN or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return getattr(self._strategy, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._strategy, name, value)

    def __repr__(self) -> str:
        return f"TrialStrategyView(trial_id={self._trial_id}, strategy={self._strategy!r})"
