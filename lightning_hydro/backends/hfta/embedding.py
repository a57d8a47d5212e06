"""Fused ``nn.Embedding`` with a correct ``padding_idx`` for every trial.

Layout: the stacked tables ``[B, V, D]`` are viewed as one ``[B*V, D]`` table and trial ``b``'s indices
are offset by ``b*V``, so ONE ``embedding`` lookup serves all trials and returns ``[B, *, D]``. A
trial's ``padding_idx`` row must not be trained: the output at that trial's padding positions is
detached (the row's stored value is still returned, as in torch). An earlier fused library passed the
padding index to the flattened table instead, which froze the wrong rows. ``max_norm`` renormalises
each trial's looked-up rows with that trial's own ``max_norm`` and ``norm_type``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_hydro.backends.hfta.fused_operator import (
    FusedModule,
    InDims,
    TrialFunction,
    VmapInfo,
    trials_first,
)


def fused_embedding(
    info: VmapInfo, in_dims: InDims, indices: Tensor, weight: Tensor, module: FusedModule
) -> tuple[Tensor, int]:
    """The fused rule of Embedding; returns (output ``[B, *, D]``, its trial dim 0)."""
    module.check_trial_count(info.batch_size)
    trials = info.batch_size
    tables = trials_first(weight, in_dims[1], trials)  # [B, V, D]
    per_trial = trials_first(indices, in_dims[0], trials).contiguous()  # [B, *]
    max_norms = module.setting("max_norm").values
    norm_types = module.setting("norm_type").values
    if any(max_norm is not None for max_norm in max_norms):
        with torch.no_grad():  # as F.embedding: renormalise the looked-up rows in place
            for trial, (max_norm, norm_type) in enumerate(zip(max_norms, norm_types)):
                if max_norm is not None:
                    torch.embedding_renorm_(tables[trial].detach(), per_trial[trial], max_norm, norm_type)
    rows = tables.shape[1]
    offsets = torch.arange(trials, device=per_trial.device).mul_(rows)
    offset_indices = per_trial + offsets.view(trials, *([1] * (per_trial.dim() - 1)))
    scale_grad_by_freq: bool = module.scale_grad_by_freq  # type: ignore[assignment]
    out = F.embedding(offset_indices, tables.reshape(-1, tables.shape[2]), scale_grad_by_freq=scale_grad_by_freq)
    padding = module.setting("padding_idx").values
    if any(index is not None for index in padding):
        no_padding = -1  # indices are never negative, so this matches nothing
        padding_column = torch.tensor(
            [no_padding if index is None else index for index in padding], device=per_trial.device
        ).view(trials, *([1] * (per_trial.dim() - 1)))
        is_padding = (per_trial == padding_column).unsqueeze(-1)
        out = torch.where(is_padding, out.detach(), out)
    return out, 0


class FusedEmbeddingFunction(TrialFunction):
    """Autograd Function whose vmap rule is :func:`fused_embedding`."""

    vmap = staticmethod(fused_embedding)


class FusedEmbedding(FusedModule, nn.Embedding):
    """``nn.Embedding`` for B trials at once; ``padding_idx``, ``max_norm`` and ``norm_type`` per trial.

    Example::

        >>> from torch.func import functional_call, stack_module_state, vmap
        >>> trials = [nn.Embedding(5, 2, padding_idx=p) for p in (0, 3)]
        >>> fused = FusedEmbedding.fuse(nn.Embedding(5, 2), trials, path="embed")
        >>> params, _ = stack_module_state(trials)
        >>> tokens = torch.tensor([[0, 3, 4]])
        >>> out = vmap(lambda p: functional_call(fused, p, (tokens,)))(params)
        >>> out.sum().backward()
        >>> params["weight"].grad[:, :, 0]  # trial 0 does not train row 0, trial 1 not row 3
        tensor([[0., 0., 0., 1., 1.],
                [1., 0., 0., 0., 1.]])
    """

    fused_from = nn.Embedding
    per_trial_attributes = ("padding_idx", "max_norm", "norm_type")

    def forward(self, input: Tensor) -> Tensor:
        """Same contract as ``nn.Embedding.forward``, per trial."""
        return FusedEmbeddingFunction.apply(input, self.weight, self)
