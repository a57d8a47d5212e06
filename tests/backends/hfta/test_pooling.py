from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lightning_hydro.backends.hfta import FUSED_OPERATORS

from .fusion_check import check_fused_matches_trials, stacked_or_shared


def pooling_module(draw: st.DrawFn, kind: str, spatial_dims: int) -> nn.Module:
    torch_class = getattr(nn, f"{kind}{spatial_dims}d")
    if kind.startswith("Adaptive"):
        return torch_class(draw(st.integers(1, 3), label="output size"))
    kernel = draw(st.integers(1, 3), label="kernel")
    stride = draw(st.integers(1, 2), label="stride")
    padding = draw(st.integers(0, kernel // 2), label="padding")
    ceil_mode = draw(st.booleans(), label="ceil mode")
    if kind == "MaxPool":
        dilation = draw(st.integers(1, 2), label="dilation")
        return torch_class(kernel, stride, padding, dilation, return_indices=draw(st.booleans()), ceil_mode=ceil_mode)
    return torch_class(kernel, stride, padding, ceil_mode, count_include_pad=draw(st.booleans()))


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_fused_pooling_matches_separate_trials(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["MaxPool", "AvgPool", "AdaptiveAvgPool", "AdaptiveMaxPool"]), label="kind")
    spatial_dims = data.draw(st.sampled_from([1, 2, 3]), label="spatial dims")
    trials = data.draw(st.integers(1, 4), label="trials")
    pool = pooling_module(data.draw, kind, spatial_dims)
    has_sample_dim = data.draw(st.booleans(), label="has sample dim")
    shape = ([2] if has_sample_dim else []) + [3] + [5] * spatial_dims
    x, in_dim = stacked_or_shared(data.draw, shape, trials)
    model = check_fused_matches_trials(lambda _: pool, trials, [x], [in_dim])
    assert isinstance(model, FUSED_OPERATORS[type(pool)])
