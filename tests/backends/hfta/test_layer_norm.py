from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lightning_hydro.backends.hfta.layer_norm import FusedLayerNorm

from .fusion_check import check_fused_matches_trials, stacked_or_shared


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_fused_layer_norm_matches_separate_trials(data: st.DataObject) -> None:
    trials = data.draw(st.integers(1, 4), label="trials")
    # Over one or two elements layer norm is degenerate (its output is 0 or +-1 up to rounding, its
    # gradient a difference of rounding errors), so draw at least three.
    normalized = data.draw(st.lists(st.integers(3, 5), min_size=1, max_size=2), label="normalized shape")
    leading = data.draw(st.lists(st.integers(1, 3), max_size=2), label="leading dims")
    eps = data.draw(st.lists(st.sampled_from([1e-5, 1e-2]), min_size=trials, max_size=trials), label="eps")
    affine, bias = data.draw(st.booleans(), label="affine"), data.draw(st.booleans(), label="bias")
    x, in_dim = stacked_or_shared(data.draw, [*leading, *normalized], trials)
    if in_dim == 1 and not leading:
        in_dim = 0

    def make(slot: int) -> nn.Module:
        norm = nn.LayerNorm(normalized, eps=eps[slot], elementwise_affine=affine, bias=bias)
        for parameter in norm.parameters():
            nn.init.normal_(parameter)
        return norm

    assert isinstance(check_fused_matches_trials(make, trials, [x], [in_dim]), FusedLayerNorm)
