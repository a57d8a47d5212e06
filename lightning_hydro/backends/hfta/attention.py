"""Fused ``nn.MultiheadAttention``: batched projections, one ``scaled_dot_product_attention`` call.

``attn_mask``, ``key_padding_mask`` and ``is_causal`` are honoured. Layout: inputs are brought to
``[B, N, L, E]`` (a shared input stays ``[N, L, E]`` and meets all B projection weights in one
matmul); heads are split to ``[B*N, H, L, d]`` so that one SDPA call attends for every trial. Masks
follow ``nn.MultiheadAttention``: boolean ``True`` means "may not attend", float masks are added,
``key_padding_mask`` ``[N, S]`` and ``attn_mask`` ``[L, S]`` or ``[N*H, L, S]`` are merged, and
``is_causal`` with no padding mask and ``need_weights=False`` uses SDPA's causal kernel. With
``need_weights=True``, per-trial dropout probabilities, or vmap randomness other than "different",
the scores are computed explicitly (the attention weights are returned, post-dropout, as torch does).
Modules with ``add_bias_kv`` or ``add_zero_attn`` are not converted (torch's own vmap rules run them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_hydro.backends.hfta.errors import FusedCallError
from lightning_hydro.backends.hfta.fused_operator import (
    FusedModule,
    InDims,
    TrialFunction,
    VmapInfo,
    drop_per_trial,
    trials_first,
    trials_first_or_shared,
)
from lightning_hydro.backends.hfta.linear import linear_per_trial, linear_shared


@dataclass(frozen=True)
class AttentionCall:
    """The non-tensor arguments of one attention call."""

    need_weights: bool
    average_attn_weights: bool
    causal: bool
    shared_inputs: str  # "qkv": self-attention, "kv": key is value, "": three distinct inputs


def _batch_first(tensor: Tensor, in_dim: int | None, batch_first: bool) -> Tensor:
    """An input as ``[B or 1, N, L, E]`` (1: shared by all trials)."""
    samples = trials_first_or_shared(tensor, in_dim)
    if samples.dim() == 3:  # unbatched attention input [L, E]
        return samples.unsqueeze(1)
    return samples if batch_first else samples.transpose(1, 2)


def _project(samples: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``samples @ weight[b].T + bias[b]`` per trial: ``[B or 1, N, L, I]`` -> ``[B, N, L, O]``."""
    if samples.shape[0] == 1:  # shared input: one matmul against all trials' weights
        return linear_shared(samples[0], weight, bias).permute(2, 0, 1, 3)
    return linear_per_trial(samples, weight, bias)


def _float_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Boolean masks (True: may not attend) become additive ``-inf`` masks, as in torch."""
    if mask.dtype == torch.bool:
        return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask, float("-inf"))
    return mask.to(dtype)


def _merged_mask(
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    in_dims: tuple[int | None, int | None],
    heads: int,
    dtype: torch.dtype,
) -> Tensor | None:
    """One additive mask broadcastable to ``[B, N, H, L, S]``, or None."""
    merged: Tensor | None = None
    if attn_mask is not None:
        mask = trials_first_or_shared(attn_mask, in_dims[1])
        if mask.dim() == 3:  # [B|1, L, S]
            mask = mask[:, None, None]
        elif mask.dim() == 4:  # [B|1, N*H, L, S]
            mask = mask.view(mask.shape[0], -1, heads, *mask.shape[2:])
        else:
            raise RuntimeError(f"attn_mask's dimension {mask.dim() - 1} is not supported")
        merged = _float_mask(mask, dtype)
    if key_padding_mask is not None:
        mask = trials_first_or_shared(key_padding_mask, in_dims[0])
        if mask.dim() == 2:  # unbatched [B|1, S]
            mask = mask.unsqueeze(1)
        padding = _float_mask(mask[:, :, None, None, :], dtype)
        merged = padding if merged is None else merged + padding
    return merged


def _flatten_mask(mask: Tensor, trials: int, batch: int) -> Tensor:
    """``[B|1, N|1, H|1, L, S]`` -> 4D, broadcastable to the ``[B*N, H, L, S]`` scores."""
    if mask.shape[0] == 1 and mask.shape[1] == 1:
        return mask[0]
    return mask.expand(trials, batch, *mask.shape[2:]).reshape(trials * batch, *mask.shape[2:])


def _project_inputs(
    in_dims: InDims,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    weights: tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None],
    biases: Tensor | None,
    module: FusedModule,
    shared_inputs: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-trial query, key and value projections, each ``[B, N, L, E]``.

    ``weights`` are the stacked ``(in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight)``,
    ``biases`` the stacked ``in_proj_bias``. Self-attention projects its one input once.
    """
    embed_dim: int = module.embed_dim  # type: ignore[assignment]
    batch_first: bool = module.batch_first  # type: ignore[assignment]
    packed, q_weight, k_weight, v_weight = weights
    bias_q, bias_k, bias_v = (None, None, None) if biases is None else biases.chunk(3, dim=-1)
    q_in = _batch_first(query, in_dims[0], batch_first)
    if packed is not None:
        if shared_inputs == "qkv":
            q, k, v = _project(q_in, packed, biases).chunk(3, dim=-1)
            return q, k, v
        q_weight, k_weight, v_weight = packed.split(embed_dim, dim=1)
        if shared_inputs == "kv":
            kv_bias = None if biases is None else biases[:, embed_dim:]
            k_in = _batch_first(key, in_dims[1], batch_first)
            k, v = _project(k_in, packed[:, embed_dim:], kv_bias).chunk(2, dim=-1)
            return _project(q_in, q_weight, bias_q), k, v
    if q_weight is None or k_weight is None or v_weight is None:
        raise FusedCallError(f"{module.describe()} has neither in_proj_weight nor q/k/v_proj_weight")
    return (
        _project(q_in, q_weight, bias_q),
        _project(_batch_first(key, in_dims[1], batch_first), k_weight, bias_k),
        _project(_batch_first(value, in_dims[2], batch_first), v_weight, bias_v),
    )


def _explicit_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    causal: bool,
    keep_probability: Tensor | None,
    randomness: str,
) -> tuple[Tensor, Tensor]:
    """Attention with its weights computed, as torch does when they are asked for.

    ``q``, ``k``, ``v`` are ``[B*N, H, L, d]``; ``keep_probability`` is ``[B, 1, 1, 1, 1]`` (per-trial
    dropout) or None. Returns (attended values, attention weights post-dropout).
    """
    if causal and mask is None:
        allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        mask = _float_mask(~allowed, q.dtype)
    scores = (q * math.sqrt(1.0 / q.shape[-1])) @ k.transpose(-2, -1)
    weights = torch.softmax(scores if mask is None else scores + mask, dim=-1)
    if keep_probability is not None:
        trials = keep_probability.shape[0]
        per_trial = weights.view(trials, -1, *weights.shape[1:])
        weights = drop_per_trial(per_trial, keep_probability, per_trial.shape, randomness, like=q).view_as(weights)
    return weights @ v, weights


def fused_multihead_attention(
    info: VmapInfo,
    in_dims: InDims,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    in_proj_weight: Tensor | None,
    in_proj_bias: Tensor | None,
    q_proj_weight: Tensor | None,
    k_proj_weight: Tensor | None,
    v_proj_weight: Tensor | None,
    out_proj_weight: Tensor,
    out_proj_bias: Tensor | None,
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    module: FusedModule,
    call: AttentionCall,
) -> tuple[Any, Any]:
    """The fused rule of MultiheadAttention; returns (output[, weights]) with trial dim 0."""
    module.check_trial_count(info.batch_size)
    trials = info.batch_size
    embed_dim: int = module.embed_dim  # type: ignore[assignment]
    heads: int = module.num_heads  # type: ignore[assignment]
    unbatched = (query.dim() if in_dims[0] is None else query.dim() - 1) == 2

    def stacked(index: int, tensor: Tensor | None) -> Tensor | None:
        return None if tensor is None else trials_first(tensor, in_dims[index], trials)

    weights = (stacked(3, in_proj_weight), stacked(5, q_proj_weight), stacked(6, k_proj_weight))
    projection_weights = (*weights, stacked(7, v_proj_weight))
    q, k, v = _project_inputs(
        in_dims, query, key, value, projection_weights, stacked(4, in_proj_bias), module, call.shared_inputs
    )
    batch, target_len = q.shape[1], q.shape[2]

    def split_heads(projected: Tensor) -> Tensor:  # [B, N, L, E] -> [B*N, H, L, d]
        per_head = projected.reshape(*projected.shape[:3], heads, embed_dim // heads).transpose(2, 3)
        return per_head.reshape(trials * batch, heads, projected.shape[2], embed_dim // heads)

    q, k, v = split_heads(q), split_heads(k), split_heads(v)
    mask = _merged_mask(key_padding_mask, attn_mask, (in_dims[10], in_dims[11]), heads, q.dtype)
    flat_mask = None if mask is None else _flatten_mask(mask, trials, batch)
    dropout = module.setting("dropout")
    dropping = module.training and any(p > 0 for p in dropout.values)
    per_trial_dropout = dropping and (not dropout.is_uniform or info.randomness != "different")
    attention_weights: Tensor | None = None
    if call.need_weights or per_trial_dropout:
        keep_probability = 1.0 - dropout.column(q, 5) if dropping else None
        attended, attention_weights = _explicit_attention(
            q, k, v, flat_mask, call.causal, keep_probability, info.randomness
        )
    else:  # one SDPA call for all trials; its dropout draws independently per (trial, sample, head)
        probability = dropout.first if dropping else 0.0
        attended = F.scaled_dot_product_attention(q, k, v, flat_mask, probability, is_causal=call.causal)
    merged_heads = attended.view(trials, batch, heads, target_len, -1).transpose(2, 3)
    out = _project(
        merged_heads.reshape(trials, batch, target_len, embed_dim),
        trials_first(out_proj_weight, in_dims[8], trials),
        stacked(9, out_proj_bias),
    )
    out = out.squeeze(1) if unbatched else out if module.batch_first else out.transpose(1, 2)
    if attention_weights is None or not call.need_weights:
        return out, 0
    per_head = attention_weights.view(trials, batch, heads, target_len, -1)
    returned = per_head.mean(dim=2) if call.average_attn_weights else per_head
    return (out, returned.squeeze(1) if unbatched else returned), (0, 0)


class FusedMultiheadAttentionFunction(TrialFunction):
    """Autograd Function whose vmap rule is :func:`fused_multihead_attention`."""

    vmap = staticmethod(fused_multihead_attention)


class FusedMultiheadAttention(FusedModule, nn.MultiheadAttention):
    """``nn.MultiheadAttention`` for B trials at once; dropout probability per trial.

    Example::

        >>> from torch.func import functional_call, stack_module_state, vmap
        >>> trials = [nn.MultiheadAttention(8, 2, batch_first=True) for _ in range(2)]
        >>> fused = FusedMultiheadAttention.fuse(nn.MultiheadAttention(8, 2, batch_first=True), trials)
        >>> params, _ = stack_module_state(trials)
        >>> x = torch.randn(3, 5, 8)
        >>> padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
        >>> run = lambda p: functional_call(fused, p, (x, x, x), {"key_padding_mask": padding})
        >>> out, weights = vmap(run)(params)
        >>> expected, _ = trials[1](x, x, x, key_padding_mask=padding)
        >>> out.shape, torch.allclose(out[1], expected, atol=1e-5)
        (torch.Size([2, 3, 5, 8]), True)
    """

    fused_from = nn.MultiheadAttention
    per_trial_attributes = ("dropout",)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Same contract as ``nn.MultiheadAttention.forward``, per trial."""
        if is_causal and attn_mask is None:
            raise RuntimeError(
                "Need attn_mask if specifying the is_causal hint. You may use the Transformer module method "
                "`generate_square_subsequent_mask` to create this mask."
            )
        causal = is_causal and key_padding_mask is None and not need_weights
        shared = "qkv" if query is key and key is value else "kv" if key is value else ""
        call = AttentionCall(need_weights, average_attn_weights, causal, shared)
        result = FusedMultiheadAttentionFunction.apply(
            query,
            key,
            value,
            self.in_proj_weight,
            self.in_proj_bias,
            self.q_proj_weight,
            self.k_proj_weight,
            self.v_proj_weight,
            self.out_proj.weight,
            self.out_proj.bias,
            key_padding_mask,
            None if causal else attn_mask,
            self,
            call,
        )
        return (result[0], result[1]) if need_weights else (result, None)
