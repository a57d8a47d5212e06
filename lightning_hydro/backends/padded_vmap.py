"""The ``vmap`` backend for trials of different widths, zero-padded to one stacked shape.

The stacked state of a ``pad_widths`` group holds every trial's tensors zero-padded to the group's largest
shapes (:mod:`lightning_hydro.stacking.padding`). vmap runs one template module for every row, so the
template here is a copy of the first trial whose padded modules (those of
:func:`~lightning_hydro.stacking.width_plan.plan_widths`) carry the padded sizes, and whose LayerNorms over
a padded width are replaced by :class:`WidthMaskedLayerNorm`, which normalises each row over its own trial's
width (a per-row 0/1 mask is mapped with the stacked buffers).

Example::

    >>> import torch
    >>> from torch import nn
    >>> from lightning_hydro.stacking import StackedState
    >>> trials = [nn.Sequential(nn.Linear(3, w), nn.LayerNorm(w), nn.ReLU(), nn.Linear(w, 2)) for w in (4, 6)]
    >>> group = StackedState(nn.Module(), trials, [0, 1], pad_widths=True)
    >>> template = PaddedVmapBackend(group).template()
    >>> type(template[1]).__name__, template[0].out_features
    ('WidthMaskedLayerNorm', 6)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_hydro.backends.base import StepOutputs
from lightning_hydro.backends.errors import FusionError
from lightning_hydro.backends.python_state import copy_template
from lightning_hydro.backends.vmap_backend import VmapBackend
from lightning_hydro.stacking.width_plan import WidthPaddingError, WidthPlan, plan_widths

if TYPE_CHECKING:
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["PaddedVmapBackend", "WidthMaskedLayerNorm", "masked_layer_norm"]

_MASK = "width_mask"


def masked_layer_norm(x: Tensor, mask: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """Layer norm over the last dimension counting only the elements where ``mask`` is 1; 0 where it is 0.

    With a mask of all ones this is ``F.layer_norm`` (biased variance, ``eps`` inside the square root).

    Example::

        >>> x = torch.tensor([[1.0, 3.0, 0.0]])
        >>> masked_layer_norm(x, torch.tensor([1.0, 1.0, 0.0]), None, None, 0.0).abs()
        tensor([[1., 1., 0.]])
    """
    count = mask.sum()
    mean = (x * mask).sum(-1, keepdim=True) / count
    centred = (x - mean) * mask
    var = (centred * centred).sum(-1, keepdim=True) / count
    out = centred * torch.rsqrt(var + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out * mask


class WidthMaskedLayerNorm(nn.LayerNorm):
    """A LayerNorm at the padded width that normalises over the width its ``width_mask`` buffer marks."""

    def __init__(self, source: nn.LayerNorm, padded: int) -> None:
        super().__init__(padded, eps=source.eps, elementwise_affine=source.elementwise_affine)
        if source.elementwise_affine and source.bias is None:
            self.bias = None
        self.register_buffer(_MASK, torch.ones(padded), persistent=False)

    @override
    def forward(self, input: Tensor) -> Tensor:
        return masked_layer_norm(input, self.get_buffer(_MASK), self.weight, self.bias, self.eps)


_SIZE_ATTRIBUTES = {"out_features", "in_features", "out_channels", "in_channels", "num_features", "embedding_dim"}


def _padded_template(first: nn.Module, plan: WidthPlan) -> nn.Module:
    """A copy of ``first`` whose padded modules carry the group's largest sizes."""
    template = copy_template(first)
    for dimension in plan.padded:
        module = template.get_submodule(dimension.path)
        widest = max(dimension.sizes)
        if isinstance(module, nn.LayerNorm):
            owner, _, leaf = dimension.path.rpartition(".")
            parent = template.get_submodule(owner) if owner else template
            replacement = WidthMaskedLayerNorm(module, widest)
            replacement.training = module.training
            setattr(parent, leaf, replacement)
        elif dimension.attribute in _SIZE_ATTRIBUTES:
            setattr(module, dimension.attribute, widest)
    return template


class PaddedVmapBackend(VmapBackend):
    """vmap over zero-padded rows of trials of different widths (a group stacked with ``pad_widths=True``).

    Raises:
        FusionError: at construction, if the width plan refuses a module (the message names it and its line),
            and when the step fails or differs under padding (e.g. a reshape to a literal size: the line named).
    """

    name = "vmap"

    def __init__(self, group: StackedState, *, chunk_size: int | None = None) -> None:
        self._plan = self._make_plan(group.modules, group.trial_ids)
        self._padded: nn.Module | None = None
        super().__init__(group, chunk_size=chunk_size)

    @staticmethod
    def _make_plan(modules: Sequence[nn.Module], ids: Sequence[int]) -> WidthPlan:
        plan = plan_widths(modules, ids=ids)
        try:
            plan.raise_if_refused()
        except WidthPaddingError as err:
            raise FusionError(f"backend='vmap' cannot pad these trials to one width: {err}") from err
        return plan

    @property
    def plan(self) -> WidthPlan:
        """The width plan of the group's current trials."""
        return self._plan

    @override
    def per_trial_settings(self, modules: Sequence[nn.Module]) -> Callable[[str], bool]:
        # a padded module's size attributes differ by construction; the template carries the padded sizes and
        # its own settings (eps, momentum...) are still compared
        padded = self._make_plan(modules, list(range(len(modules)))).padded_paths
        return lambda path: path in padded

    @override
    def template(self) -> nn.Module:
        first = self.group.modules[0]
        if self._padded is None:
            self._padded = _padded_template(first, self._plan)
        padded = self._padded
        modes = {name: module.training for name, module in first.named_modules()}
        for name, module in padded.named_modules():
            module.training = modes.get(name, first.training)
        if isinstance(first, L.LightningModule) and isinstance(padded, L.LightningModule):
            padded.trainer = first._trainer  # a copy loses it
        return padded

    @override
    def extra_buffers(self) -> dict[str, Tensor]:
        masks: dict[str, Tensor] = {}
        device = self.group.device
        for dimension in self._plan.padded:
            if dimension.attribute != "normalized_shape":
                continue
            widest = max(dimension.sizes)
            mask = torch.zeros(self.group.size, widest, device=device)
            for row, width in enumerate(dimension.sizes):
                mask[row, :width] = 1.0
            masks[f"{dimension.path}.{_MASK}"] = mask
        return masks

    @override
    def rebind(self) -> None:
        super().rebind()
        self._plan = self._make_plan(self.group.modules, self.group.trial_ids)
        self._padded = None

    @override
    def run(self, method: str, *args: Any) -> StepOutputs:
        try:
            return super().run(method, *args)
        except FusionError as err:
            raise FusionError(
                f"{err} With padded widths, every trial's code runs at the group's largest sizes: an op whose "
                "meaning depends on a size (a view or reshape to a literal size, a head split) fails or computes "
                "something else. Fuse only trials of identical shapes (pad_widths=False) for this model."
            ) from err
