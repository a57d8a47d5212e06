import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro.backends.hfta import FusedCallError, convert_to_fused
from lightning_hydro.backends.hfta.fused_operator import (
    TrialAnchor,
    logical_shape,
    random_uniform,
    trials_at,
    trials_first,
)
from lightning_hydro.backends.hfta.linear import FusedLinear


def test_fuse_only_takes_the_exact_torch_class() -> None:
    class MyLinear(nn.Linear):
        pass

    with pytest.raises(TypeError, match=r"FusedLinear.fuse expects a Linear, got MyLinear; subclasses may change"):
        FusedLinear.fuse(MyLinear(2, 2), [MyLinear(2, 2)])


class ReadsAnchor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 3)
        self.anchor = TrialAnchor(self, "layer.weight")

    def forward(self) -> torch.Tensor:
        return self.anchor()


def test_trial_anchor_sees_the_stacked_parameter_under_functional_call() -> None:
    model = ReadsAnchor()
    assert model() is model.layer.weight
    stacked = torch.randn(4, 3, 2)
    assert torch.equal(vmap(lambda weight: functional_call(model, {"layer.weight": weight}, ()))(stacked), stacked)


def test_parameter_free_operator_on_the_shared_batch_sees_the_trials_through_the_anchor() -> None:
    trials = [nn.Sequential(nn.Linear(1, 1), nn.Dropout(p)) for p in (0.0, 1.0)]
    model = convert_to_fused(trials[0], trials)
    model[0] = nn.Identity()  # only the dropout touches the data; the Linear's weight stays the anchor
    params, _ = stack_module_state(trials)
    x = torch.ones(5)
    out = vmap(lambda p: functional_call(model, p, (x,), strict=False), randomness="different")(params)
    assert torch.equal(out, torch.stack([torch.ones(5), torch.zeros(5)]))


def test_layout_helpers() -> None:
    x = torch.zeros(5, 3, 2)
    assert trials_first(x, 1, 3).shape == (3, 5, 2)
    assert trials_at(torch.zeros(5, 2), None, 1, 3).shape == (5, 3, 2)
    assert logical_shape(x, 2) == (5, 3)
    assert random_uniform("same", (4, 2), x).shape == (1, 2)
    with pytest.raises(FusedCallError, match=r"vmap: called random operation while in randomness error mode"):
        random_uniform("error", (4, 2), x)
