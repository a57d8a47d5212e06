from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lightning_hydro.backends.hfta.group_norm import FusedGroupNorm

from .fusion_check import check_fused_matches_trials, stacked_or_shared


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_fused_group_norm_matches_separate_trials(data: st.DataObject) -> None:
    trials = data.draw(st.integers(1, 4), label="trials")
    groups = data.draw(st.integers(1, 3), label="groups")
    channels = groups * data.draw(st.integers(1, 3))
    # At least three values per group: over one or two, normalising is degenerate (output 0 or +-1
    # up to rounding, gradient a difference of rounding errors).
    spatial = data.draw(st.lists(st.integers(3, 4), min_size=1, max_size=2), label="spatial dims")
    eps = data.draw(st.lists(st.sampled_from([1e-5, 1e-2]), min_size=trials, max_size=trials), label="eps")
    affine = data.draw(st.booleans(), label="affine")
    x, in_dim = stacked_or_shared(data.draw, [3, channels, *spatial], trials)

    def make(slot: int) -> nn.Module:
        norm = nn.GroupNorm(groups, channels, eps=eps[slot], affine=affine)
        for parameter in norm.parameters():
            nn.init.normal_(parameter)
        return norm

    assert isinstance(check_fused_matches_trials(make, trials, [x], [in_dim]), FusedGroupNorm)
