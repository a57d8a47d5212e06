import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lightning_hydro.backends.hfta import FusedCallError
from lightning_hydro.backends.hfta.linear import FusedLinear

from .fusion_check import check_fused_matches_trials, stacked_or_shared


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_fused_linear_matches_separate_trials(data: st.DataObject) -> None:
    trials = data.draw(st.integers(1, 4), label="trials")
    in_features, out_features = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6))
    bias = data.draw(st.booleans(), label="bias")
    leading = data.draw(st.lists(st.integers(1, 4), max_size=2), label="leading dims")
    x, in_dim = stacked_or_shared(data.draw, [*leading, in_features], trials)
    if in_dim == 1 and not leading:
        in_dim = 0
    model = check_fused_matches_trials(lambda _: nn.Linear(in_features, out_features, bias=bias), trials, [x], [in_dim])
    assert isinstance(model, FusedLinear)


def test_fused_linear_refuses_to_run_outside_vmap() -> None:
    model = FusedLinear.fuse(nn.Linear(2, 3), [nn.Linear(2, 3)], path="head")
    with pytest.raises(FusedCallError, match=r"FusedLinear at 'head' ran outside torch.func.vmap"):
        model(torch.randn(4, 2))
