"""The trials' layers must exist, with their shapes, when a fused group stacks them.

A group stacks every parameter and buffer of its trials when it is built (and when a trial joins it, or a checkpoint
rebuilds it). Layers that get their tensors later are built or caught here:

- layers built in ``configure_model`` (the hook Lightning calls at the start of each stage to build the model) are
  built then: :func:`build_trial_layers` calls each trial's ``configure_model()`` before it is stacked. Lightning asks
  the hook to be idempotent; the Trainer's own call at fit start, on the group, does not reach the trials. Unlike
  alone, the layers' initial weights are drawn when the group is built, trial after trial, not at fit start; on the
  CPU and in float32 (the Trainer then moves and casts them, as it does the layers of ``__init__``);
- a lazy layer (``nn.LazyLinear``) has no shape until its first forward: :func:`refuse_lazy_layers` names it;
- layers built in ``setup`` (a head sized from the data) come after the stacking: :func:`setup_checked` names
  their parameters. A buffer ``setup`` registers (statistics of the data) stays the trial's own, and one it
  reassigns goes into the trial's row, as alone.

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

from collections.abc import Iterator
from contextlib import contextmanager

import lightning as L
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor, nn
from torch.nn.parameter import is_lazy

from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["build_trial_layers", "refuse_lazy_layers", "setup_checked"]


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


@contextmanager
def setup_checked(group: StackedState, stage: str, *, backend: str) -> Iterator[None]:
    """Around the running trials' ``setup(stage)``: refuse the parameters it changed; adopt the buffers it reassigned.

    A parameter ``setup`` gave a trial (a layer built there), removed, or replaced (a layer built again, whatever its
    shape) is not a view of the trial's stacked row: nothing would train it as the trial's own. A buffer it registered
    stays the trial's own, outside the group: the loop runs each trial's module with it, but vmap and hfta run one
    template's for every trial, so there it must be equal in every trial (statistics of the data are). One it
    reassigned goes into the trial's row, as the trial's code sees it alone. What changed is what ``setup`` changed: a
    group deep-copied before the stage is bound to its rows only later.

    Args:
        group: the running trials' stacked state.
        stage: the stage, for the messages.
        backend: the fused module's ``backend=`` (all but ``"loop"`` may run one template for every trial).

    Raises:
        ValueError: naming each such parameter of the first trial that has one, and the remedy; a reassigned buffer
            of another shape or dtype than its row's; a registered buffer that differs between trials (not on loop).
    """
    before = [_tensors_held(module) for module in group.modules]  # held: a freed tensor's id may come back
    yield
    stage = str(getattr(stage, "value", stage))  # Lightning passes its TrainerFn (a str enum)
    if backend != "loop":
        _refuse_differing_new_buffers(group, stage, backend, [buffers for _, buffers in before])
    reassigned: dict[str, dict[int, Tensor]] = {}
    for row, (tid, module, (params, buffers)) in enumerate(zip(group.trial_ids, group.modules, before)):
        own = dict(module.named_parameters())
        changes = [f"{name!r} (new)" for name in own if name not in params]
        changes += [
            f"{name!r} ({'replaced' if name in own else 'removed'})"
            for name, known in params.items()
            if name not in own or own[name] is not known
        ]
        if changes:
            raise ValueError(
                f"FusedLightningModule: trial {tid}'s setup({stage!r}) gave it parameters the fused group does not "
                f"hold: {', '.join(changes)}. A fused group stacks the trials' parameters when it is built, before "
                "setup runs, so nothing would train these as the trial's own. Build these layers in __init__, e.g. "
                "from a size the DataModule gives before fusing (dm.prepare_data(); dm.setup('fit'); "
                "MyModule(num_classes=dm.num_classes)), or in configure_model, which the group calls when it is built."
            )
        for name in group.buffers:
            buffer = module.get_buffer(name)
            if buffer is buffers[name]:
                continue
            held = group.trial_view(name, row, group.buffers[name][row])
            if buffer.shape != held.shape or buffer.dtype != held.dtype:
                raise ValueError(
                    f"FusedLightningModule: trial {tid}'s setup({stage!r}) made its buffer {name!r} "
                    f"{tuple(buffer.shape)} {buffer.dtype}, where the fused group holds {tuple(held.shape)} "
                    f"{held.dtype} for it: a group stacks the trials' buffers when it is built, before setup runs, "
                    "and a row keeps its shape and dtype. Register the buffer in __init__ with its final shape and "
                    "dtype (e.g. from a size the DataModule gives before fusing), or register it in setup only."
                )
            reassigned.setdefault(name, {})[row] = buffer
    if reassigned:
        group.replace_buffers({name: group.with_rows(name, values) for name, values in reassigned.items()})


def _refuse_differing_new_buffers(
    group: StackedState, stage: str, backend: str, before: list[dict[str, Tensor]]
) -> None:
    """Raise ``ValueError`` for a buffer ``setup`` registered whose value differs between the trials."""
    if not group.modules:  # every trial has ended (e.g. a test after the fit): nothing runs fused
        return
    first = group.modules[0]
    for name, buffer in first.named_buffers():
        if name in group.buffers or name in before[0]:
            continue
        for tid, module in zip(group.trial_ids[1:], group.modules[1:]):
            other = dict(module.named_buffers()).get(name)
            if other is None or other.shape != buffer.shape or not torch.equal(other, buffer):
                raise ValueError(
                    f"FusedLightningModule: setup({stage!r}) registered the buffer {name!r} with values that differ "
                    f"between trials {group.trial_ids[0]} and {tid}. The fused group does not hold it (it stacks the "
                    f"trials' buffers when it is built, before setup runs), and backend={backend!r} may run one "
                    f"template module's buffers for every trial: each would use trial {group.trial_ids[0]}'s. Register "
                    "the buffer in __init__ (each trial's row then holds its own; setup may fill or reassign it), or "
                    "use backend='loop', which runs each trial's own module."
                )


def _tensors_held(module: nn.Module) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The tensor ``module`` holds under each parameter and buffer name (kept alive, so compared by identity)."""
    return dict(module.named_parameters()), dict(module.named_buffers())
