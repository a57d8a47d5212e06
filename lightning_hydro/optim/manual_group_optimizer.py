"""The group optimizer of trials that use manual optimization: it holds every trial's optimizers, it steps none.

Under manual optimization (``automatic_optimization = False``) each trial's ``training_step`` steps its own
optimizers (``opt.step()``), so the group's one optimizer, the one Lightning sees, only keeps them: for
checkpoints (each trial's optimizers and schedulers in torch's format, by trial id), for the slots (a trial's
optimizers leave and join with it) and for Lightning's step count. A trial may have several optimizers (a GAN's
generator and discriminator); the universal path is the only one, as each trial's own optimizer steps.

Example::

    >>> import torch
    >>> from torch import nn
    >>> from lightning_hydro.optim.optimizer_config import TrialOptimization
    >>> from lightning_hydro.stacking.stacked_state import StackedState
    >>> trials = [nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1)) for _ in range(2)]
    >>> group = StackedState(nn.Module(), trials, [0, 1])
    >>> own = {
    ...     tid: TrialOptimization(torch.optim.SGD(m[0].parameters(), lr=0.1),
    ...                            more_optimizers=[torch.optim.Adam(m[1].parameters())])
    ...     for tid, m in zip([0, 1], trials)
    ... }
    >>> optimizer = ManualGroupOptimizer(group, own)
    >>> [len(states) for states in optimizer.state_dict()["trials"].values()]
    [2, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_hydro.optim.group_optimizer import RowsToSkip, StepReport, TrialGroupOptimizer
from lightning_hydro.optim.optimizer_config import TrialOptimization

if TYPE_CHECKING:
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["ManualGroupOptimizer"]


class ManualGroupOptimizer(TrialGroupOptimizer):
    """Keeps the optimizers of trials whose ``training_step`` steps them itself (manual optimization).

    Args:
        group: the stacked state of the group (rows = live trials).
        trials: each live trial's optimizers and schedulers, by trial id.
    """

    def __init__(self, group: StackedState, trials: Mapping[int, TrialOptimization]) -> None:
        super().__init__(group, trials, path="universal")

    @override
    def step(  # type: ignore[override]
        self, closure: Callable[[], Any] | None = None, *, skip: RowsToSkip | None = None
    ) -> StepReport | None:
        """Run the closure only: each trial's ``training_step`` steps its own optimizers."""
        if closure is not None:
            closure()
        return None

    @override
    def zero_grad(self, set_to_none: bool = True) -> None:
        for trial in self.trials.values():
            for optimizer in trial.optimizers:
                optimizer.zero_grad(set_to_none=set_to_none)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "trials": {tid: [o.state_dict() for o in t.optimizers] for tid, t in self.trials.items()},
            "schedulers": {tid: [s.scheduler.state_dict() for s in t.schedulers] for tid, t in self.trials.items()},
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        missing = [tid for tid in self.trials if tid not in state_dict["trials"]]
        if missing:
            raise KeyError(f"The checkpoint has no optimizer state for trials {missing}.")
        for tid, trial in self.trials.items():
            states = state_dict["trials"][tid]
            if not isinstance(states, list) or len(states) != len(trial.optimizers):
                count = len(states) if isinstance(states, list) else "a single"
                raise ValueError(
                    f"The checkpoint holds {count} optimizer state(s) for trial {tid}, whose configure_optimizers() "
                    f"returns {len(trial.optimizers)}; resume with the trials (and optimization mode) that wrote it."
                )
            for optimizer, state in zip(trial.optimizers, states):
                optimizer.load_state_dict(state)
            for spec, sched_state in zip(trial.schedulers, state_dict["schedulers"][tid]):
                spec.scheduler.load_state_dict(sched_state)
