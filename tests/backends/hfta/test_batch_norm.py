import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro.backends.hfta import FusedCallError, convert_to_fused
from lightning_hydro.backends.hfta.batch_norm import FusedBatchNorm1d, FusedBatchNorm2d, FusedBatchNorm3d

from .fusion_check import check_fused_matches_trials, stacked_or_shared

BATCH_NORMS = {
    (1, 0): (nn.BatchNorm1d, FusedBatchNorm1d),
    (1, 1): (nn.BatchNorm1d, FusedBatchNorm1d),
    (2, 2): (nn.BatchNorm2d, FusedBatchNorm2d),
    (3, 3): (nn.BatchNorm3d, FusedBatchNorm3d),
}


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_fused_batch_norm_matches_separate_trials(data: st.DataObject) -> None:
    kind, spatial_dims = data.draw(st.sampled_from(list(BATCH_NORMS)), label="kind, spatial dims")
    torch_class, fused_class = BATCH_NORMS[(kind, spatial_dims)]
    trials = data.draw(st.integers(1, 4), label="trials")
    channels = data.draw(st.integers(1, 4), label="channels")
    momenta = data.draw(st.lists(st.sampled_from([0.1, 0.5, None]), min_size=trials, max_size=trials))
    eps = data.draw(st.lists(st.sampled_from([1e-5, 1e-3]), min_size=trials, max_size=trials), label="eps")
    affine, track = data.draw(st.booleans(), label="affine"), data.draw(st.booleans(), label="track")
    train = data.draw(st.booleans(), label="train")
    x, in_dim = stacked_or_shared(data.draw, [4, channels] + [3] * spatial_dims, trials)

    def make(slot: int) -> nn.Module:
        norm = torch_class(channels, eps=eps[slot], momentum=momenta[slot], affine=affine, track_running_stats=track)
        if track:  # non-trivial running statistics, so that eval mode tells trials apart
            norm.running_mean.normal_()
            norm.running_var.uniform_(0.5, 2.0)
            norm.num_batches_tracked.fill_(slot + 1)
        if affine:
            nn.init.normal_(norm.weight)
            nn.init.normal_(norm.bias)
        return norm

    model = check_fused_matches_trials(make, trials, [x * 2 + 1], [in_dim], train=train)
    assert isinstance(model, fused_class)


def test_running_statistics_follow_each_trial_over_steps() -> None:
    trials = [nn.BatchNorm2d(3, momentum=m) for m in (0.1, None, 0.9)]
    model = convert_to_fused(trials[0], trials)
    params, buffers = stack_module_state(trials)
    for step in range(3):
        x = torch.randn(4, 3, 5, 5) * (step + 1)
        vmap(lambda p, b, x=x: functional_call(model, (p, b), (x,)), in_dims=(0, 0))(params, buffers)
        for trial in trials:
            trial(x)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        expected = torch.stack([getattr(trial, name) for trial in trials])
        torch.testing.assert_close(buffers[name], expected.to(buffers[name].dtype))


def test_fused_batch_norm_needs_stacked_buffers_to_update() -> None:
    trials = [nn.BatchNorm1d(3) for _ in range(2)]
    model = convert_to_fused(trials[0], trials)
    params, buffers = stack_module_state(trials)
    shared_buffers = {name: buffer[0] for name, buffer in buffers.items()}
    x = torch.randn(4, 3)
    with pytest.raises(FusedCallError, match=r"running statistics, but they are not batched over trials"):
        vmap(lambda p, b: functional_call(model, (p, b), (x,)), in_dims=(0, None))(params, shared_buffers)


def test_fused_batch_norm_rejects_a_single_value_per_channel_like_torch() -> None:
    trials = [nn.BatchNorm1d(3, eps=e) for e in (1e-5, 1e-3)]
    model = convert_to_fused(trials[0], trials)
    params, buffers = stack_module_state(trials)
    x = torch.randn(1, 3)
    with pytest.raises(ValueError, match=r"Expected more than 1 value per channel when training"):
        vmap(lambda p, b: functional_call(model, (p, b), (x,)), in_dims=(0, 0))(params, buffers)
