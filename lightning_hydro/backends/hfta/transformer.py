"""``nn.TransformerEncoder`` / ``nn.TransformerEncoderLayer`` with torch's C++ fast path switched off.

In eval mode without gradients these modules hand the whole layer to fused C++ kernels
(``_transformer_encoder_layer_fwd``, nested tensors for padding masks) that have no vmap batching rule:
vmap then either loops over trials slowly, bypassing the fused operators, or fails outright. Their
Python path calls their submodules, which are fused operators, so these wrappers run that path.
They hold no per-trial settings of their own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lightning_hydro.backends.hfta.fused_operator import FusedModule


class _PythonPathOnly(FusedModule):
    torch_forward_when_compiling = False  # its forward is the torch one already (its submodules are fused)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The torch module's own forward, with ``torch.backends.mha`` fast path disabled meanwhile."""
        enabled = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            return self.fused_from.forward(self, *args, **kwargs)
        finally:
            torch.backends.mha.set_fastpath_enabled(enabled)


class FusedTransformerEncoderLayer(_PythonPathOnly, nn.TransformerEncoderLayer):
    """``nn.TransformerEncoderLayer`` that always runs its Python path (its submodules are fused).

    Example::

        >>> layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        >>> type(FusedTransformerEncoderLayer.fuse(layer, [layer], path="block")).__name__
        'FusedTransformerEncoderLayer'
    """

    fused_from = nn.TransformerEncoderLayer


class FusedTransformerEncoder(_PythonPathOnly, nn.TransformerEncoder):
    """``nn.TransformerEncoder`` that never converts its input to nested tensors (no vmap rule exists).

    Example::

        >>> layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        >>> encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        >>> FusedTransformerEncoder.fuse(encoder, [encoder]).num_trials
        1
    """

    fused_from = nn.TransformerEncoder
