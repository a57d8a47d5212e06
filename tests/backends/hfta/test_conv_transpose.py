import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lightning_hydro.backends.hfta.conv_transpose import (
    FusedConvTranspose1d,
    FusedConvTranspose2d,
    FusedConvTranspose3d,
)

from .fusion_check import check_fused_matches_trials, stacked_or_shared

TRANSPOSED = {
    1: (nn.ConvTranspose1d, FusedConvTranspose1d),
    2: (nn.ConvTranspose2d, FusedConvTranspose2d),
    3: (nn.ConvTranspose3d, FusedConvTranspose3d),
}


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_fused_conv_transpose_matches_separate_trials(data: st.DataObject) -> None:
    spatial_dims = data.draw(st.sampled_from([1, 2, 2, 3]), label="spatial dims")
    torch_class, fused_class = TRANSPOSED[spatial_dims]
    trials = data.draw(st.integers(1, 4), label="trials")
    groups = data.draw(st.sampled_from([1, 2]), label="groups")
    in_channels, out_channels = groups * data.draw(st.integers(1, 3)), groups * data.draw(st.integers(1, 3))
    kernel, stride = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2))
    padding, dilation = data.draw(st.integers(0, 1)), data.draw(st.integers(1, 2))
    output_padding = data.draw(st.integers(0, max(stride, dilation) - 1), label="output padding")
    has_sample_dim = data.draw(st.booleans(), label="has sample dim")
    shape = ([2] if has_sample_dim else []) + [in_channels] + [4] * spatial_dims
    x, in_dim = stacked_or_shared(data.draw, shape, trials)

    def make(_: int) -> nn.Module:
        return torch_class(in_channels, out_channels, kernel, stride, padding, output_padding, groups, True, dilation)

    assert isinstance(check_fused_matches_trials(make, trials, [x], [in_dim]), fused_class)


def test_fused_conv_transpose_honours_output_size() -> None:
    x = torch.randn(2, 3, 4, 4)

    def make(_: int) -> nn.Module:
        return nn.ConvTranspose2d(3, 2, 3, stride=2)

    check_fused_matches_trials(make, 2, [x], [None], kwargs={"output_size": [10, 10]})
