"""``scaled_dot_product_attention`` for every trial in one kernel call: the trial dimension joins the batch.

Under ``torch.func.vmap`` torch's own batching of attention goes wrong in two ways. Its composite chooses the
kernel before vmap's batching rules run, on tensors that report ``requires_grad=False`` (vmap's batched
tensors do), so on CUDA it picks the memory-efficient kernel without the log-sum-exp that its backward needs
(``RuntimeError: LSE is not correctly aligned (strideH)``); on CPU the flash kernel has no batching rule and
vmap loops over the trials one by one. The rule here hands attention the stacked tensors: query, key, value
and mask of B trials folded into one batch ``[B * N, ...]``, contiguous where torch would copy anyway, to
the public ``scaled_dot_product_attention``. That call sees what each trial's unfused call sees (dtypes,
``requires_grad``, head size, mask, dropout, ``is_causal``), so torch chooses the same kernel (flash,
memory-efficient or math on CUDA; flash or math on CPU) and autograd records it, backward included, as for an
unfused call with a larger batch.

Dropout draws independent masks per trial and sample (vmap's ``randomness="different"``, the fused step's
setting); with ``"same"`` every trial gets the draws of one call, with ``"error"`` it raises as vmap does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_hydro.backends.trial_ops.batching import VmapOnlyFunction, trials_first, trials_first_or_shared

__all__ = ["MAX_FOLDED_BATCH_CUDA", "attention_rule", "fold_attention", "max_folded_batch"]

_ATTENTION = F.scaled_dot_product_attention  # the function itself, whatever torch.nn.functional holds later

# CUDA's flash and memory-efficient kernels put the batch on a grid axis of at most 65535 blocks: a folded
# batch beyond that is attended in several calls, each trial whole.
MAX_FOLDED_BATCH_CUDA = 65535


def max_folded_batch(device: torch.device) -> int | None:
    """The largest folded batch one attention call on ``device`` takes (None: no limit)."""
    return MAX_FOLDED_BATCH_CUDA if device.type == "cuda" else None


def _signature(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, float, bool, float | None, bool]:
    return query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa


def _attend(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    dropout: float,
    causal: bool,
    scale: float | None,
    gqa: bool,
) -> Tensor:
    extra = {"enable_gqa": True} if gqa else {}  # the argument exists since torch 2.5
    return _ATTENTION(query, key, value, mask, dropout, causal, scale=scale, **extra)


def _fold(tensor: Tensor, trials: int, batch: int) -> Tensor:
    """``[B, n, ...]`` with ``n`` in (1, batch) -> ``[B * batch, ...]``."""
    return tensor.expand(trials, batch, *tensor.shape[2:]).reshape(trials * batch, *tensor.shape[2:])


def _fold_mask(mask: Tensor, rank: int, trials: int, batch: int) -> Tensor:
    """A ``[B or 1, *mask]`` mask, broadcastable to the ``[B * batch, ..., L, S]`` scores of rank ``rank``."""
    logical = mask.shape[1:]
    mask = mask.reshape(mask.shape[0], *([1] * (rank - len(logical))), *logical)  # left-padded as broadcasting does
    if mask.shape[0] == 1 and mask.shape[1] == 1:
        return mask[0]  # shared by the trials and the batch: broadcast as it is
    return _fold(mask, trials, batch)


def fold_attention(
    info: Any,
    in_dims: tuple[int | None, ...],
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> tuple[Tensor, int]:
    """The vmap rule: one attention call over the folded trials; returns (output, its trial dim 0)."""
    trials = info.batch_size
    if dropout_p > 0 and info.randomness == "error":
        raise RuntimeError(
            "vmap: called random operation while in randomness error mode. Please either use the 'same' or "
            "'different' randomness flags on vmap or perform the randomness operation out of vmap"
        )
    q, k, v = (trials_first(t, d, trials) for t, d in zip((query, key, value), in_dims[:3]))
    mask = None if attn_mask is None else trials_first_or_shared(attn_mask, in_dims[3])
    rank = q.dim() - 1
    if dropout_p > 0 and info.randomness == "same":  # every trial draws what one call draws
        return _same_dropout(q, k, v, mask, (dropout_p, is_causal, scale, enable_gqa)), 0
    if rank == 2:  # [L, E] per trial: the trials are the batch
        while mask is not None and mask.dim() < 3:
            mask = mask.unsqueeze(1)
        return _attend(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa), 0
    batch = max(q.shape[1], k.shape[1], v.shape[1])
    limit = max_folded_batch(q.device)
    per_call = trials if limit is None else max(1, min(trials, limit // max(batch, 1)))
    outputs = []
    for start in range(0, trials, per_call):
        rows = slice(start, start + per_call)
        count = len(range(*rows.indices(trials)))
        chunk_mask = None
        if mask is not None:
            chunk_mask = _fold_mask(mask if mask.shape[0] == 1 else mask[rows], rank, count, batch)
        folded_q, folded_k, folded_v = (_fold(t[rows], count, batch) for t in (q, k, v))
        attended = _attend(folded_q, folded_k, folded_v, chunk_mask, dropout_p, is_causal, scale, enable_gqa)
        outputs.append(attended.unflatten(0, (count, batch)))
    return (outputs[0] if len(outputs) == 1 else torch.cat(outputs)), 0


def _same_dropout(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, options: tuple[float, bool, float | None, bool]
) -> Tensor:
    """Each trial attended alone from the same random state (vmap's ``randomness="same"``)."""
    devices = [q.device] if q.device.type == "cuda" else []
    cpu_state = torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state(q.device) if devices else None
    outputs = []
    for row in range(q.shape[0]):
        torch.set_rng_state(cpu_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state, q.device)
        row_mask = None if mask is None else mask[0 if mask.shape[0] == 1 else row]
        outputs.append(_attend(q[row], k[row], v[row], row_mask, *options))
    return torch.stack(outputs)


class FoldedAttention(VmapOnlyFunction):
    """Attention whose vmap rule is :func:`fold_attention`."""

    vmap = staticmethod(fold_attention)


def attention_rule(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``scaled_dot_product_attention(*args, **kwargs)`` with the trials folded into the batch where possible.

    Arguments that cannot be folded unambiguously (query, key and value of different ranks, a mask of
    higher rank than the query) go to ``original``, i.e. to vmap's own batching.
    """
    query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa = _signature(*args, **kwargs)
    ranks = {query.dim(), key.dim(), value.dim()}
    if len(ranks) != 1 or query.dim() < 2 or (attn_mask is not None and attn_mask.dim() > query.dim()):
        return original(*args, **kwargs)
    return FoldedAttention.apply(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
