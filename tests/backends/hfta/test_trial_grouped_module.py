import importlib

import pytest
import torch
from torch import nn
from torch.func import vmap

from lightning_hydro.backends.hfta import FusedCallError
from lightning_hydro.backends.hfta.trial_grouped_module import TrialGroupedModule, group_trials


def test_group_trials_keeps_first_appearance_order() -> None:
    trials = [nn.Softplus(beta) for beta in (2.0, 1.0, 2.0, 3.0, 1.0)]
    assert group_trials(trials, ["beta"]) == [[0, 2], [1, 4], [3]]


def test_grouped_module_follows_trial_removal() -> None:
    trials = [nn.ELU(alpha) for alpha in (1.0, 0.5, 2.0)]
    grouped = TrialGroupedModule(trials, ["alpha"])
    grouped.select_trials([2, 0])
    x = -torch.ones(2, 4)
    torch.testing.assert_close(vmap(grouped)(x), torch.stack([trials[2](x[0]), trials[0](x[1])]))


def test_random_modules_draw_independently_within_a_group() -> None:
    trials = [nn.AlphaDropout(p) for p in (0.5, 0.5, 0.2)]
    grouped = TrialGroupedModule(trials, ["p"]).train()
    out = vmap(grouped, randomness="different")(torch.ones(3, 1000))
    assert not torch.equal(out[0], out[1])


def test_modules_that_do_not_return_one_tensor_are_refused() -> None:
    class Pair(nn.Module):
        def __init__(self, scale: float) -> None:
            super().__init__()
            self.scale = scale

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, x * self.scale

    grouped = TrialGroupedModule([Pair(1.0), Pair(2.0)], ["scale"], path="pair")
    with pytest.raises(FusedCallError, match=r"Pair at 'pair' returned tuple; only modules that return one tensor"):
        vmap(grouped)(torch.ones(2, 3))


@pytest.mark.parametrize("name", ["TrialGroupedFunction", "TrialGroupedModule", "group_trials", "grouped_rule"])
def test_the_old_module_path_resolves_with_a_warning(name):
    old = importlib.import_module("lightning_hydro.backends.hfta.trial_groups")
    new = importlib.import_module("lightning_hydro.backends.hfta.trial_grouped_module")
    with pytest.warns(DeprecationWarning, match=rf"hfta.trial_groups.{name} moved to .*trial_grouped_module.{name} "):
        assert getattr(old, name) is getattr(new, name)
