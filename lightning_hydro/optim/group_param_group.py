"""``GroupParamGroup``: the param group of the fused group's optimizer, which holds no hyperparameters.

The group's optimizer steps every trial with the hyperparameters of the trial's own optimizer; a callback written for
one model that sets ``trainer.optimizers[0].param_groups[0]["lr"]`` (a warm-up) alone sets the trial's. Set on the
group's, it would reach no trial: refused, with the way to reach each trial's.

Example::

    >>> group = GroupParamGroup({"params": []})
    >>> group["lr"] = 0.1
    Traceback (most recent call last):
    ...
    lightning_hydro.optim.group_param_group.GroupHyperparameterError: FusedLightningModule: param_group['lr'] = ...
"""

from __future__ import annotations

from typing import Any

__all__ = ["GroupHyperparameterError", "GroupParamGroup"]


class GroupHyperparameterError(ValueError):
    """A hyperparameter was set on the fused group's optimizer, where it would reach no trial."""


class GroupParamGroup(dict[str, Any]):
    """The group optimizer's param group: a hyperparameter set or read here would reach no trial, so it is refused.

    The fused update reads each trial's hyperparameters from the trial's own optimizer (``lr``, ``momentum``, ...).
    A callback's warm-up that sets ``trainer.optimizers[0].param_groups[0]["lr"]`` alone sets the trial's.
    """

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self:
            raise GroupHyperparameterError(
                f"FusedLightningModule: param_group[{key!r}] = ... on the group's optimizer (trainer.optimizers, a "
                "callback's optimizer argument) reaches no trial: the group steps every trial with the "
                "hyperparameters of the trial's own optimizer. Set them there (fused.trial_module(tid).optimizers()"
                ".param_groups), or in the trial's own hooks or LR scheduler, which run per trial as alone."
            )
        super().__setitem__(key, value)

    def __reduce__(self) -> Any:  # a copy is built whole (pickle and deepcopy would set each entry anew)
        return (type(self), (dict(self),))

    def __missing__(self, key: str) -> Any:
        raise KeyError(
            f"{key!r}: the fused group's optimizer holds no hyperparameters; each trial's own optimizer does "
            "(fused.trial_module(tid).optimizers().param_groups)"
        )
