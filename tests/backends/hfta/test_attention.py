import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro.backends.hfta import convert_to_fused
from lightning_hydro.backends.hfta.attention import FusedMultiheadAttention

from .fusion_check import IN_DIMS, WithAnchor, check_fused_matches_trials


def attention_inputs(shape: list[int], trials: int, in_dim: int | None) -> torch.Tensor:
    return torch.randn(*shape) if in_dim is None else torch.randn(trials, *shape)


def boolean_mask(*shape: int) -> torch.Tensor:
    """Random True (= may not attend) entries; the first key always stays visible, so no row is all -inf."""
    mask = torch.rand(*shape) < 0.4
    mask[..., 0] = False
    return mask


def as_float(mask: torch.Tensor) -> torch.Tensor:
    return torch.zeros(mask.shape).masked_fill(mask, float("-inf")) + torch.randn(mask.shape) * 0.1


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_fused_attention_matches_separate_trials(data: st.DataObject) -> None:
    trials = data.draw(st.integers(1, 3), label="trials")
    heads = data.draw(st.integers(1, 2), label="heads")
    embed_dim = heads * data.draw(st.integers(1, 3), label="head dim")
    batch_first = data.draw(st.booleans(), label="batch first")
    batched = data.draw(st.booleans(), label="has sample dim")
    kind = data.draw(st.sampled_from(["self", "key is value", "cross", "kdim/vdim"]), label="kind")
    batch, target_len = 2, data.draw(st.integers(1, 4), label="target len")
    source_len = target_len if kind == "self" else data.draw(st.integers(1, 4), label="source len")
    kdim = vdim = embed_dim
    if kind == "kdim/vdim":
        kdim, vdim = data.draw(st.integers(1, 3), label="kdim"), data.draw(st.integers(1, 3), label="vdim")

    def sequence(length: int, width: int) -> list[int]:
        if not batched:
            return [length, width]
        return [batch, length, width] if batch_first else [length, batch, width]

    query_dim = data.draw(IN_DIMS, label="query in dim")
    query = attention_inputs(sequence(target_len, embed_dim), trials, query_dim)
    inputs, in_dims = [query], [query_dim]
    if kind == "self":
        inputs, in_dims = [query, query, query], [query_dim] * 3
    else:
        key_dim = data.draw(IN_DIMS, label="key in dim")
        key = attention_inputs(sequence(source_len, kdim), trials, key_dim)
        if kind == "key is value":
            inputs, in_dims = [query, key, key], [query_dim, key_dim, key_dim]
        else:
            value_dim = data.draw(IN_DIMS, label="value in dim")
            value = attention_inputs(sequence(source_len, vdim), trials, value_dim)
            inputs, in_dims = [query, key, value], [query_dim, key_dim, value_dim]
    kwargs: dict = {
        "need_weights": data.draw(st.booleans(), label="need weights"),
        "average_attn_weights": data.draw(st.booleans(), label="average weights"),
    }
    if data.draw(st.booleans(), label="key padding mask"):
        padding = boolean_mask(batch, source_len) if batched else boolean_mask(source_len)
        if data.draw(st.booleans(), label="padding mask per trial"):
            stacked = torch.stack([boolean_mask(*padding.shape) for _ in range(trials)])
            inputs.append(stacked)
            in_dims.append(0)
        else:
            kwargs["key_padding_mask"] = padding if data.draw(st.booleans()) else as_float(padding)
    mask_kind = data.draw(st.sampled_from(["none", "2d", "3d", "causal"]), label="attn mask")
    if mask_kind == "causal":
        kwargs["attn_mask"] = torch.full((target_len, source_len), float("-inf")).triu(diagonal=1)
        kwargs["is_causal"] = source_len == target_len
    elif mask_kind != "none":
        shape = (
            [target_len, source_len]
            if mask_kind == "2d"
            else [(batch if batched else 1) * heads, target_len, source_len]
        )
        mask = boolean_mask(*shape)
        kwargs["attn_mask"] = mask if data.draw(st.booleans(), label="bool mask") else as_float(mask)
    bias = data.draw(st.booleans(), label="bias")

    def make(_: int) -> nn.Module:
        return nn.MultiheadAttention(embed_dim, heads, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first)

    model = check_fused_matches_trials(make, trials, inputs, in_dims, kwargs=kwargs, tolerance=1e-5)
    assert isinstance(model, FusedMultiheadAttention)


@pytest.mark.parametrize("need_weights", [False, True])
def test_fused_attention_in_eval_mode_matches_torchs_fast_path(need_weights: bool) -> None:
    x = torch.randn(2, 5, 8)
    padding = boolean_mask(2, 5)

    def make(slot: int) -> nn.Module:
        return nn.MultiheadAttention(8, 2, dropout=0.1 * slot, batch_first=True)

    with torch.no_grad():
        check_fused_matches_trials(
            make,
            3,
            [x, x, x],
            [None] * 3,
            kwargs={"key_padding_mask": padding, "need_weights": need_weights},
            train=False,
        )


@pytest.mark.parametrize("need_weights", [False, True])
def test_fused_attention_dropout_is_per_trial(need_weights: bool) -> None:
    probabilities = [0.0, 0.5, 0.5]
    trials = [WithAnchor(nn.MultiheadAttention(4, 1, dropout=p, batch_first=True)) for p in probabilities]
    for trial in trials:  # identical weights, so only dropout tells trials apart
        trial.load_state_dict(trials[0].state_dict())
    model = convert_to_fused(trials[0], trials)
    params, _ = stack_module_state(trials)
    x = torch.randn(1, 64, 4)
    out = vmap(
        lambda p: functional_call(model, p, (x, x, x), {"need_weights": need_weights})[0],
        randomness="different",
    )(params)
    expected, _ = trials[0].eval()(x, x, x)
    torch.testing.assert_close(out[0], expected)
    assert not torch.allclose(out[1], expected)
    assert not torch.allclose(out[1], out[2])


def test_is_causal_needs_a_mask_like_torch() -> None:
    x = torch.randn(2, 3, 4)
    with pytest.raises(RuntimeError, match=r"Need attn_mask if specifying the is_causal hint"):
        check_fused_matches_trials(
            lambda _: nn.MultiheadAttention(4, 1), 2, [x, x, x], [None] * 3, kwargs={"is_causal": True}
        )


def test_attention_with_bias_kv_is_left_to_torchs_rules() -> None:
    x = torch.randn(3, 2, 4)
    model = check_fused_matches_trials(
        lambda _: nn.MultiheadAttention(4, 2, add_bias_kv=True), 2, [x, x, x], [None] * 3
    )
    assert type(model) is nn.MultiheadAttention
