"""The trials' layers must exist, with their shapes, when a fused group stacks them.

A group stacks every parameter and buffer of its trials when it is built (and when a trial joins it, or a checkpoint
rebuilds it). Layers that get their tensors later are built or caught here:

- layers built in ``configure_model`` (the hook Lightning calls at the start of each stage to build the model) are
  built then: :func:`build_trial_layers` calls each trial's ``configure_model()`` before it is stacked. Lightning asks
  the hook to be idempotent; the Trainer's own call at fit start, on the group, does not reach the trials. Unlike
  alone, the layers' initial weights are drawn when the group is built, trial after trial, not at fit start; on the
  CPU and in float32 (the Trainer then moves and casts them, as it does the layers of ``__init__``);
- a lazy layer (``nn.LazyLinear``) has no shape until its first forward: :func:`refuse_lazy_layers` names it.

Example::

    >>> from torch import nn
    >>> import lightning as L
    >>> class Lazy(L.LightningModule):
    ...     def __init__(self) -> None:
    ...         super().__init__()
    ...         self.head = nn.LazyLinear(2)
    >>> refuse_lazy_layers(Lazy(), 0, "FusedLightningModule")
    Traceback (most recent call last):
    ...
    ValueError: FusedLightningModule: trial 0 (Lazy) has lazy layers that no forward has materialised yet: 'head' ...
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn
from torch.nn.parameter import is_lazy

__all__ = ["build_trial_layers", "refuse_lazy_layers"]


def build_trial_layers(module: nn.Module, trial_id: int, where: str) -> None:
    """Call the trial's ``configure_model()`` (if it overrides it), then refuse it if it has lazy layers left.

    Args:
        module: the trial's module.
        trial_id: its id, for the messages.
        where: what builds the group, for the messages (``"FusedLightningModule"``, ``"add_trial"``).

    Raises:
        RuntimeError: ``configure_model()`` failed (e.g. it reads ``self.trainer``, which a group being built lacks).
        ValueError: lazy layers (:func:`refuse_lazy_layers`).
    """
    if isinstance(module, L.LightningModule) and is_overridden("configure_model", module, L.LightningModule):
        try:
            module.configure_model()
        except Exception as err:
            raise RuntimeError(
                f"{where}: trial {trial_id}'s configure_model() failed when the group called it to build the trial's "
                f"layers, before any Trainer ({type(err).__name__}: {err}). A fused group stacks the trials' "
                "parameters when it is built, so it calls configure_model() then, not at fit start. Build the layers "
                "in __init__, or let configure_model() build them without a Trainer."
            ) from err
    refuse_lazy_layers(module, trial_id, where)


def refuse_lazy_layers(module: nn.Module, trial_id: int, where: str) -> None:
    """Raise ``ValueError`` naming each lazy layer of ``module`` whose tensors have no shape yet; else nothing.

    Args:
        module: the trial's module.
        trial_id: its id, for the message.
        where: what refuses it, for the message (``"FusedLightningModule"``, ``"add_trial"``).
    """
    lazy = [
        f"{name!r} ({type(layer).__name__})" if name else f"the module itself ({type(layer).__name__})"
        for name, layer in module.named_modules()
        if any(is_lazy(tensor) for tensor in (*layer.parameters(recurse=False), *layer.buffers(recurse=False)))
    ]
    if lazy:
        raise ValueError(
            f"{where}: trial {trial_id} ({type(module).__name__}) has lazy layers that no forward has materialised "
            f"yet: {', '.join(lazy)}. A fused group stacks the trials' parameters when it is built, and a lazy "
            "layer's have no shape before its first forward. Run one forward on each trial before fusing it (e.g. "
            "trial(x) on an example batch, or self(torch.zeros(1, in_features)) at the end of __init__), or give "
            "the layers their input sizes (nn.Linear(in_features, out_features))."
        )
