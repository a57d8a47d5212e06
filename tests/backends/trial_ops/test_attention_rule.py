"""Attention under the fused vmap step: one kernel call over the trials folded into the batch (issue 20, item 1).

Without the rule, vmap batches ``scaled_dot_product_attention`` with tensors that report
``requires_grad=False``; on CUDA torch then picks the memory-efficient kernel without the log-sum-exp its backward
needs (``LSE is not correctly aligned (strideH)``), on CPU it loops over the trials (a "performance drop" warning).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro.backends.trial_ops import attention
from lightning_hydro.backends.trial_ops.functional_patch import trial_functional
from tests.helpers import attention_nodes

TRIALS, BATCH, HEADS, LENGTH, HEAD_DIM = 3, 4, 2, 7, 8


def fused_and_alone(step, tensors: list[Tensor], in_dims: tuple[int | None, ...]) -> tuple[Tensor, Tensor]:
    """``step`` under vmap with the trial rules, and for each trial alone, stacked."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # vmap's "performance drop" fallback warning fails the test
        with trial_functional():
            fused = vmap(step, in_dims=in_dims, randomness="different")(*tensors)
    alone = torch.stack(
        [step(*(t if d is None else t.select(d, row) for t, d in zip(tensors, in_dims))) for row in range(TRIALS)]
    )
    return fused, alone


def gradients(outputs: Tensor, tensors: list[Tensor]) -> list[Tensor]:
    weights = torch.linspace(-1, 1, outputs.numel()).view_as(outputs)
    grads = torch.autograd.grad((outputs * weights).sum(), [t for t in tensors if t.requires_grad])
    return list(grads)


def qkv(shape: tuple[int, ...] = (BATCH, HEADS, LENGTH, HEAD_DIM)) -> list[Tensor]:
    return [torch.randn(TRIALS, *shape, requires_grad=True) for _ in range(3)]


MASKS = {
    "none": lambda: None,
    "shared float [L, S]": lambda: torch.randn(LENGTH, LENGTH),
    "shared bool [L, S]": lambda: torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril(),
    "shared per-sample bool [N, 1, 1, S]": lambda: torch.rand(BATCH, 1, 1, LENGTH) > 0.3,
    "shared float [1, H, L, S]": lambda: torch.randn(1, HEADS, LENGTH, LENGTH),
}


@pytest.mark.parametrize(("mask_name", "is_causal"), [*((name, False) for name in MASKS), ("none", True)])
def test_folded_attention_equals_each_trial_alone_forward_and_backward(mask_name, is_causal):
    mask = MASKS[mask_name]()
    tensors = qkv()
    fused, alone = fused_and_alone(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal),
        tensors,
        (0, 0, 0),
    )
    torch.testing.assert_close(fused, alone, rtol=1e-5, atol=1e-6)
    for got, expected in zip(gradients(fused, tensors), gradients(alone, tensors)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_a_per_trial_learned_mask_gets_its_own_gradient():
    tensors = [*qkv(), torch.randn(TRIALS, LENGTH, LENGTH, requires_grad=True)]
    step = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    fused, alone = fused_and_alone(step, tensors, (0, 0, 0, 0))
    torch.testing.assert_close(fused, alone, rtol=1e-5, atol=1e-6)
    for got, expected in zip(gradients(fused, tensors), gradients(alone, tensors)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(LENGTH, HEAD_DIM), (BATCH, LENGTH, HEAD_DIM), (BATCH, 2, HEADS, LENGTH, HEAD_DIM)])
def test_every_rank_that_attention_takes_is_folded(shape):
    tensors = qkv(shape)
    step = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    fused, alone = fused_and_alone(step, tensors, (0, 0, 0))
    torch.testing.assert_close(fused, alone, rtol=1e-5, atol=1e-6)


def test_a_query_computed_per_trial_attends_to_keys_shared_by_all_trials():
    query = torch.randn(TRIALS, BATCH, HEADS, LENGTH, HEAD_DIM, requires_grad=True)
    key, value = torch.randn(1, HEADS, LENGTH, HEAD_DIM), torch.randn(1, HEADS, LENGTH, HEAD_DIM)
    step = lambda q, k, v: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
    fused, alone = fused_and_alone(step, [query, key, value], (0, None, None))
    torch.testing.assert_close(fused, alone, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif("enable_gqa" not in F.scaled_dot_product_attention.__doc__, reason="torch < 2.5")
def test_grouped_query_attention_is_folded():
    query = torch.randn(TRIALS, BATCH, 4, LENGTH, HEAD_DIM, requires_grad=True)
    key, value = (torch.randn(TRIALS, BATCH, 2, LENGTH, HEAD_DIM, requires_grad=True) for _ in range(2))
    step = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    fused, alone = fused_and_alone(step, [query, key, value], (0, 0, 0))
    torch.testing.assert_close(fused, alone, rtol=1e-5, atol=1e-6)


def test_all_trials_attend_in_one_kernel_call_of_the_kernel_an_unfused_call_uses():
    tensors = qkv()
    step = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    fused, _alone = fused_and_alone(step, tensors, (0, 0, 0))
    unfused_kernel = attention_nodes(F.scaled_dot_product_attention(*(t[0] for t in tensors), is_causal=True))
    assert len(unfused_kernel) == 1
    assert attention_nodes(fused) == unfused_kernel  # one call, the same kernel, for every trial


def test_the_kernel_sees_the_stacked_tensors_as_they_require_gradients(monkeypatch):
    seen = []

    def spy(query, *args, **kwargs):
        seen.append((query.requires_grad, tuple(query.shape)))
        return F.scaled_dot_product_attention(query, *args, **kwargs)

    monkeypatch.setattr(attention, "_ATTENTION", spy)
    tensors = qkv()
    with trial_functional():
        vmap(lambda q, k, v: F.scaled_dot_product_attention(q, k, v))(*tensors)
    # torch picks its kernel (and whether to keep what backward needs) from requires_grad: here it is visible
    assert seen == [(True, (TRIALS * BATCH, HEADS, LENGTH, HEAD_DIM))]


def test_a_large_folded_batch_is_attended_in_chunks_of_whole_trials(monkeypatch):
    monkeypatch.setattr(attention, "max_folded_batch", lambda device: 2 * BATCH)  # 2 trials per call
    tensors = qkv()
    step = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    fused, alone = fused_and_alone(step, tensors, (0, 0, 0))
    torch.testing.assert_close(fused, alone, rtol=1e-5, atol=1e-6)
    assert len(attention_nodes(fused)) == 2  # trials 0-1, then trial 2


def identical_trials_with_dropout(randomness: str) -> Tensor:
    q = torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM).expand(TRIALS, -1, -1, -1, -1).clone().requires_grad_()
    with trial_functional():
        return vmap(lambda q: F.scaled_dot_product_attention(q, q, q, dropout_p=0.5), randomness=randomness)(q)


def test_attention_dropout_draws_independently_per_trial():
    out = identical_trials_with_dropout("different")
    assert not torch.equal(out[0], out[1])
    assert not torch.equal(out[1], out[2])


def test_attention_dropout_under_randomness_same_draws_one_mask_for_all_trials():
    out = identical_trials_with_dropout("same")
    assert torch.equal(out[0], out[1])
    assert torch.equal(out[1], out[2])


def test_attention_dropout_under_randomness_error_raises_as_vmap_does():
    with pytest.raises(RuntimeError, match="randomness error mode"):
        identical_trials_with_dropout("error")


def test_multihead_attention_modules_use_the_rule():
    modules = [nn.MultiheadAttention(16, 4, batch_first=True) for _ in range(TRIALS)]
    params, _ = stack_module_state(modules)
    x = torch.randn(BATCH, LENGTH, 16)
    mask = nn.Transformer.generate_square_subsequent_mask(LENGTH)

    def step(p: dict[str, Tensor]) -> Tensor:
        return functional_call(modules[0], p, (x, x, x), {"attn_mask": mask, "need_weights": False})[0]

    with trial_functional():
        fused = vmap(step)(params)
    alone = torch.stack([m(x, x, x, attn_mask=mask, need_weights=False)[0] for m in modules])
    torch.testing.assert_close(fused, alone, rtol=1e-5, atol=1e-6)
    assert len(attention_nodes(fused)) == 1
