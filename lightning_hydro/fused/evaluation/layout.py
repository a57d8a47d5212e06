"""``EvaluationLayout``: every trial of a fused group, running and ended, stacked for one evaluation stage.

Early stopping retires trials during a fit: their rows leave the stacked state (so later steps cost less) and
each keeps its last weights in its own module (:attr:`TrialSlots.retired`). A user who then calls
``trainer.test`` / ``trainer.validate`` / ``trainer.predict`` expects every trial of the group evaluated, the
ended ones included, as if each trial's module were evaluated alone.

For such a stage the group is evaluated on a *separate* stacked state that holds the running trials and the
retired ones (by trial id), on a storage module that is not part of the fused module. The fit layout (the
module's registered stacked tensors, the group optimizer that references them, the backend bound to them) is
never touched: it is only set aside while the stage runs and put back at its end. Why a separate state, not a
restack of the fit state in place: the stacked Parameter objects must keep their identity and shape for the
optimizer and for the module's ``state_dict``, so a resumed fit, a checkpoint written after the evaluation,
or a second ``trainer.fit`` see exactly what they would have seen without it. The cost is one copy of the
group's weights for the length of the stage.

The running trials' modules are bound to the evaluation rows during the stage (the backends run each trial's
own module code on its row) and bound back to the fit rows after it; the retired ones get their own tensors
back (copies of the same values). Nothing an evaluation does to the evaluation rows reaches the fit layout.

Example::

    >>> import torch
    >>> from torch import nn
    >>> from lightning_hydro.demos import DigitsMLP
    >>> from lightning_hydro.fused.step.backend_policy import BackendPolicy
    >>> from lightning_hydro.fused.group.slots import TrialSlots
    >>> slots = TrialSlots(nn.Module(), [DigitsMLP(hidden_dim=8) for _ in range(3)], [0, 1, 2], max_slots=3)
    >>> policy = BackendPolicy("vmap", slots, verify=False, deterministic=False)
    >>> _ = slots.stop(1, "stopped", "a decision")
    >>> layout = EvaluationLayout.enter(slots, policy)
    >>> slots.trial_ids, policy.backend.group is slots.group
    ([0, 1, 2], True)
    >>> layout.leave()
    >>> slots.trial_ids, sorted(slots.retired)
    ([0, 2], [1])
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_hydro.backends import Backend, make_backend
from lightning_hydro.fused.group.slots import TrialSlots
from lightning_hydro.fused.step.backend_policy import BackendPolicy
from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["EvaluationLayout"]


class EvaluationLayout:
    """The running and retired trials of a group stacked for one evaluation stage; :meth:`leave` restores the fit.

    Build it with :meth:`enter`.

    Args:
        slots: the group's slots; ``slots.group`` is the evaluation state while the layout is entered.
        policy: the group's backend policy; its backends run on the evaluation state meanwhile.
        fit_group: the fit layout's stacked state, put back by :meth:`leave`.
        fit_backends: the policy's backend, parked backend and evaluation fallbacks of the fit layout.
    """

    def __init__(
        self,
        slots: TrialSlots,
        policy: BackendPolicy,
        fit_group: StackedState,
        fit_backends: tuple[Backend | None, Backend | None, dict[str, Backend]],
    ) -> None:
        self.slots = slots
        self.policy = policy
        self.fit_group = fit_group
        self.fit_backends = fit_backends
        self.group = slots.group

    @classmethod
    def enter(cls, slots: TrialSlots, policy: BackendPolicy) -> EvaluationLayout | None:
        """Stack every trial of the group (running and retired, by id) and run the group's backends on it.

        Returns:
            The entered layout, or None where no trial has ended (the fit layout holds every trial already).
        """
        if not slots.retired:
            return None
        fit_group = slots.group
        everyone = sorted([*slots.running(), *slots.retired.items()], key=lambda pair: pair[0])
        # evaluation runs under torch.inference_mode: the stacked copies must be ordinary tensors all the same,
        # since a trial's module owns tensors made from them after the stage (and may train again)
        with torch.inference_mode(False), torch.no_grad():
            group = StackedState(
                nn.Module(),  # not a submodule of the fused module: its state_dict and optimizer never see it
                [module for _, module in everyone],
                [tid for tid, _ in everyone],
                pad_widths=fit_group.pad_widths,
            )
        fit_backends = (policy.backend, policy.parked, policy.eval_fallback)
        name = policy.recorded_name  # auto's choice even while parked for a lone trial; None before it chose
        # the evaluation methods that needed the loop need it here too (said once, during the fit)
        policy.backend = None if name is None else make_backend(name, group)
        policy.parked = None
        policy.eval_fallback = {method: make_backend("loop", group) for method in fit_backends[2]}
        slots.group = group
        return cls(slots, policy, fit_group, fit_backends)

    def leave(self) -> None:
        """Put the fit layout back: running trials bound to their fit rows, retired ones on their own tensors."""
        if self.slots.group is not self.group:
            raise RuntimeError("EvaluationLayout.leave: the group's layout changed during evaluation; leave it once.")
        running = set(self.fit_group.trial_ids)
        with torch.inference_mode(False), torch.no_grad():
            for tid, module in zip(self.group.trial_ids, self.group.modules):
                if tid not in running:
                    self.group.detach(module)  # copies of the rows they came with: nothing evaluated stays
        self.slots.group = self.fit_group
        self.fit_group.bind()
        self.policy.backend, self.policy.parked, self.policy.eval_fallback = self.fit_backends
        self.policy.rebind()
