"""The trials' layers must exist, with their shapes, when a fused group stacks them.

A group stacks every parameter and buffer of its trials when it is built (and when a trial joins it, or a checkpoint
rebuilds it). Layers that get their tensors later are caught here, each with the remedy: a lazy layer
(``nn.LazyLinear``) has no shape until its first forward.

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

from torch import nn
from torch.nn.parameter import is_lazy

__all__ = ["refuse_lazy_layers"]


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
