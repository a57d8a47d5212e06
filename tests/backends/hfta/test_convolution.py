import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lightning_hydro.backends.hfta.convolution import FusedConv1d, FusedConv2d, FusedConv3d

from .fusion_check import check_fused_matches_trials, stacked_or_shared

CONVOLUTIONS = {1: (nn.Conv1d, FusedConv1d), 2: (nn.Conv2d, FusedConv2d), 3: (nn.Conv3d, FusedConv3d)}


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_fused_convolution_matches_separate_trials(data: st.DataObject) -> None:
    spatial_dims = data.draw(st.sampled_from([1, 2, 3]), label="spatial dims")
    torch_class, fused_class = CONVOLUTIONS[spatial_dims]
    trials = data.draw(st.integers(1, 4), label="trials")
    groups = data.draw(st.sampled_from([1, 2]), label="groups")
    in_channels, out_channels = groups * data.draw(st.integers(1, 3)), groups * data.draw(st.integers(1, 3))
    kernel = data.draw(st.integers(1, 3), label="kernel")
    padding_mode = data.draw(st.sampled_from(["zeros", "reflect", "replicate", "circular"]))
    padding = data.draw(st.sampled_from([0, 1, "same"]), label="padding")
    stride = 1 if padding == "same" else data.draw(st.integers(1, 2), label="stride")
    dilation = data.draw(st.integers(1, 2), label="dilation")
    size = data.draw(st.integers(kernel * dilation + 1, 7), label="size")
    has_sample_dim = data.draw(st.booleans(), label="has sample dim")
    shape = ([3] if has_sample_dim else []) + [in_channels] + [size] * spatial_dims
    x, in_dim = stacked_or_shared(data.draw, shape, trials)

    def make(_: int) -> nn.Module:
        return torch_class(
            in_channels,
            out_channels,
            kernel,
            stride,
            padding,
            dilation,
            groups,
            bias=trials % 2 == 1,
            padding_mode=padding_mode,
        )

    assert isinstance(check_fused_matches_trials(make, trials, [x], [in_dim]), fused_class)


@pytest.mark.parametrize("in_dim", [None, 0, 1])
def test_fused_conv2d_chain_keeps_trials_apart(in_dim: int | None) -> None:
    """Two convolutions in a row: the second reads the first's [N, B, O, H, W] layout without a copy."""
    x = torch.randn(3, 2, 3, 6, 6) if in_dim is not None else torch.randn(2, 3, 6, 6)

    def make(_: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 3, groups=2))

    check_fused_matches_trials(make, 3, [x], [in_dim])
