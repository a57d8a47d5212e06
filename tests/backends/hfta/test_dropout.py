import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro.backends.hfta import FusedCallError, convert_to_fused
from lightning_hydro.backends.hfta.dropout import FusedDropout, FusedDropout1d, FusedDropout2d, FusedDropout3d

from .fusion_check import WithAnchor

DROPOUTS = {
    nn.Dropout: (FusedDropout, [2, 3, 4]),
    nn.Dropout1d: (FusedDropout1d, [2, 3, 4]),
    nn.Dropout2d: (FusedDropout2d, [2, 3, 4, 4]),
    nn.Dropout3d: (FusedDropout3d, [2, 3, 4, 4, 4]),
}


def run_dropout(trials: list[nn.Module], x: torch.Tensor, in_dim: int | None, randomness: str = "different"):
    models = [WithAnchor(trial) for trial in trials]  # a parameter, as in any real model
    fused = convert_to_fused(models[0], models)
    params, buffers = stack_module_state(models)
    x = x.clone().requires_grad_()
    out = vmap(lambda p, b, t: functional_call(fused, (p, b), (t,)), in_dims=(0, 0, in_dim), randomness=randomness)(
        params, buffers, x
    )
    return fused, x, out


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_fused_dropout_drops_per_trial_with_each_trials_p(data: st.DataObject) -> None:
    torch_class = data.draw(st.sampled_from(list(DROPOUTS)), label="dropout class")
    fused_class, shape = DROPOUTS[torch_class]
    trials = data.draw(st.integers(2, 4), label="trials")
    probabilities = data.draw(st.lists(st.sampled_from([0.0, 0.3, 0.7, 1.0]), min_size=trials, max_size=trials))
    if len(set(probabilities)) == 1:
        probabilities[0] = 0.5  # equal p stays with torch's own rule; tested below
    in_dim = data.draw(st.sampled_from([None, 0]), label="in dim")
    x = torch.rand(shape) + 1.0 if in_dim is None else torch.rand(trials, *shape) + 1.0
    fused, x_leaf, out = run_dropout([torch_class(p) for p in probabilities], x, in_dim)
    assert isinstance(fused.inner, fused_class)
    out.sum().backward()
    for slot, p in enumerate(probabilities):
        expected_input = x if in_dim is None else x[slot]
        kept = out[slot] != 0
        if p == 1.0:
            assert not kept.any()
            continue
        # Kept elements are scaled by 1 / (1 - p), dropped ones are 0, and the gradient follows the mask.
        torch.testing.assert_close(out[slot][kept], expected_input[kept] / (1 - p))
        if torch_class is not nn.Dropout:  # whole channels: all positions of a (sample, channel) agree
            channel_kept = kept.flatten(2) if len(shape) > 2 else kept
            assert (channel_kept.all(-1) | ~channel_kept.any(-1)).all()
    grad = x_leaf.grad
    assert grad is not None


def test_fused_dropout_rate_matches_p_and_masks_are_independent() -> None:
    probabilities = [0.2, 0.5, 0.5]
    _, _, out = run_dropout([nn.Dropout(p) for p in probabilities], torch.ones(20000), None)
    dropped = (out == 0).float().mean(dim=1)
    torch.testing.assert_close(dropped, torch.tensor(probabilities), atol=0.02, rtol=0)
    assert not torch.equal(out[1] == 0, out[2] == 0)  # same p, independent masks


def test_fused_dropout_is_identity_in_eval_mode() -> None:
    trials = [nn.Dropout(p) for p in (0.2, 0.9)]
    x = torch.randn(2, 5)
    models = [WithAnchor(trial).eval() for trial in trials]
    fused = convert_to_fused(models[0], models)
    params, _ = stack_module_state(models)
    out = vmap(lambda p: functional_call(fused, p, (x,)))(params)
    assert torch.equal(out, x.expand(2, 2, 5))


def test_fused_dropout_honours_randomness_same_and_error() -> None:
    _, _, out = run_dropout([nn.Dropout(p) for p in (0.5, 0.5001)], torch.ones(1000), None, randomness="same")
    assert torch.equal(out[0] == 0, out[1] == 0)
    with pytest.raises(FusedCallError, match=r"vmap: called random operation while in randomness error mode"):
        run_dropout([nn.Dropout(p) for p in (0.5, 0.1)], torch.ones(10), None, randomness="error")


def test_equal_p_stays_with_torchs_rule_and_still_draws_per_trial() -> None:
    fused, _, out = run_dropout([nn.Dropout(0.5) for _ in range(2)], torch.ones(1000), None)
    assert type(fused.inner) is nn.Dropout
    assert not torch.equal(out[0] == 0, out[1] == 0)
