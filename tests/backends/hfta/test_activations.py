import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lightning_hydro.backends.hfta.activations import FusedLeakyReLU, FusedPReLU
from lightning_hydro.backends.hfta.trial_grouped_module import TrialGroupedModule

from .fusion_check import check_fused_matches_trials, stacked_or_shared

NATIVE_ACTIVATIONS = [nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Mish, nn.Softplus, nn.ELU]


@pytest.mark.parametrize("activation", NATIVE_ACTIVATIONS)
@pytest.mark.parametrize("in_dim", [None, 0, 1])
def test_activations_with_shared_settings_stay_native_and_exact(
    activation: type[nn.Module], in_dim: int | None
) -> None:
    x = torch.randn(3, 4, 5) if in_dim is None else torch.randn(3, 3, 4, 5)
    model = check_fused_matches_trials(lambda _: activation(), 3, [x], [in_dim])
    assert type(model) is activation


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_fused_leaky_relu_uses_each_trials_slope(data: st.DataObject) -> None:
    trials = data.draw(st.integers(2, 4), label="trials")
    slopes = data.draw(st.lists(st.sampled_from([0.01, 0.1, 0.5, -0.2]), min_size=trials, max_size=trials))
    slopes[0] = 0.3  # at least one differs, or torch's rule is kept
    x, in_dim = stacked_or_shared(data.draw, [3, 4], trials)
    model = check_fused_matches_trials(lambda slot: nn.LeakyReLU(slopes[slot]), trials, [x], [in_dim])
    assert isinstance(model, FusedLeakyReLU)


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_fused_prelu_learns_each_trials_own_slopes(data: st.DataObject) -> None:
    trials = data.draw(st.integers(1, 4), label="trials")
    channels = data.draw(st.integers(1, 4), label="channels")
    per_channel = data.draw(st.booleans(), label="per channel")
    shapes = [[2, channels], [2, channels, 3], [2, channels, 3, 3]] + ([] if per_channel else [[channels]])
    shape = data.draw(st.sampled_from(shapes), label="shape")
    x, in_dim = stacked_or_shared(data.draw, shape, trials)
    if in_dim == 1 and len(shape) == 1:
        in_dim = 0

    def make(slot: int) -> nn.Module:
        return nn.PReLU(channels if per_channel else 1, init=0.1 * (slot + 1))

    assert isinstance(check_fused_matches_trials(make, trials, [x], [in_dim]), FusedPReLU)


@pytest.mark.parametrize(
    ("make", "differing"),
    [
        (lambda slot: nn.ELU(alpha=[1.0, 0.5, 1.0][slot]), "alpha"),
        (lambda slot: nn.GELU(approximate=["none", "tanh", "tanh"][slot]), "approximate"),
        (lambda slot: nn.Softplus(beta=[1.0, 2.0, 3.0][slot]), "beta"),
        (lambda slot: nn.Hardtanh(-1.0, [1.0, 0.5, 2.0][slot]), "max_val"),
        (lambda slot: nn.Softmax(dim=[0, 1, 1][slot]), "dim"),
    ],
)
@pytest.mark.parametrize("in_dim", [None, 0, 1])
def test_activations_whose_trials_differ_run_grouped_and_exact(make, differing: str, in_dim: int | None) -> None:
    x = torch.randn(4, 5) if in_dim is None else torch.randn(3, 4, 5)
    model = check_fused_matches_trials(make, 3, [x], [in_dim])
    assert isinstance(model, TrialGroupedModule)
    assert model.differing == (differing,)


def test_fused_prelu_rejects_a_channel_mismatch_like_torch() -> None:
    x = torch.randn(2, 3)
    with pytest.raises(RuntimeError, match=r"FusedPReLU at .inner.: Mismatch of parameter numbers and input channel"):
        check_fused_matches_trials(lambda _: nn.PReLU(2), 2, [x], [None])
