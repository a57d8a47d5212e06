"""What ``FusedLightningModule(pad_widths=True)`` checks and decides: trials of different widths in one group.

The trials are stacked zero-padded to the group's largest shapes (:mod:`lightning_hydro.stacking.padding`),
each bound to its own width. That is exact when:

- the width plan holds (:func:`~lightning_hydro.stacking.width_plan.plan_widths`): only hidden sizes differ,
  through modules that treat a zero unit as absent; refused otherwise, naming each module;
- each trial's own optimizer steps only its own elements: the *universal* optimizer path, whose optimizers
  hold the trials' own (true-width) parameters, so that the padding is never written and stays exactly zero
  whatever the activation, momentum, weight decay or Adam's epsilon would do with it. The fused fast path
  (one update over whole stacked tensors) is not used for padded groups.

Example::

    >>> from torch import nn
    >>> import lightning as L
    >>> class Net(L.LightningModule):
    ...     def __init__(self, width: int) -> None:
    ...         super().__init__()
    ...         self.net = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))
    >>> width_optimizer_path([Net(8), Net(16)], [0, 1], pad_widths=True, optimizer_path="auto")
    'universal'
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from lightning_hydro.optim.group_optimizer import OptimizerPath
from lightning_hydro.stacking.width_plan import plan_widths

__all__ = ["width_optimizer_path"]


def width_optimizer_path(
    trials: Sequence[nn.Module], ids: Sequence[int], *, pad_widths: bool, optimizer_path: OptimizerPath
) -> OptimizerPath:
    """The optimizer path a group uses; with ``pad_widths``, the width plan is checked first.

    Raises:
        WidthPaddingError: if ``pad_widths`` and the plan refuses a module (the message names each one).
        ValueError: if ``pad_widths`` and ``optimizer_path="fused"``.
    """
    if not pad_widths:
        return optimizer_path
    plan_widths(trials, ids=ids).raise_if_refused()
    if optimizer_path == "fused":
        raise ValueError(
            "FusedLightningModule: pad_widths=True steps each trial's own optimizer on its own width "
            "(optimizer_path='universal'), which keeps the padding exactly zero; got optimizer_path='fused'. "
            "Use optimizer_path='auto' or 'universal'."
        )
    return "universal"
