"""Zero-padding maths and the padded StackedState (issue 14 item 1): each trial bound at its own width."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_hydro.stacking import ArchitectureMismatchError, StackedState
from lightning_hydro.stacking.padding import pad_to, padded_shape, padding_mask, true_region, zero_padding_


def test_padded_shape_is_the_elementwise_largest_and_refuses_other_ranks() -> None:
    assert padded_shape([(4, 3), (6, 2), (5, 5)]) == (6, 5)
    assert padded_shape([(), ()]) == ()
    with pytest.raises(ValueError, match=r"shapes of different ranks cannot be padded to one: \[\(4,\), \(4, 1\)\]"):
        padded_shape([(4,), (4, 1)])


def test_pad_to_keeps_the_tensor_in_the_leading_corner_and_zeros_elsewhere() -> None:
    t = torch.arange(6.0).reshape(2, 3) + 1
    padded = pad_to(t, (4, 5))
    assert torch.equal(padded[true_region(t.shape)], t)
    assert padded.sum() == t.sum()
    assert pad_to(t, (2, 3)) is t
    with pytest.raises(ValueError, match=r"cannot pad a tensor of shape \[2, 3\] to \[1, 5\]"):
        pad_to(t, (1, 5))


def test_padding_mask_and_zero_padding_guard() -> None:
    stacked = torch.ones(2, 3, 4)
    mask = padding_mask([(2, 4), (3, 1)], (3, 4), like=stacked)
    assert mask[0].sum() == 8
    assert mask[1].sum() == 3
    zero_padding_(stacked, [(2, 4), (3, 1)])
    assert torch.equal(stacked, mask)


def mlp(width: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, 2))


def test_each_trial_is_bound_to_its_own_width_inside_its_padded_row() -> None:
    trials = [mlp(4, 0), mlp(6, 1)]
    own = [m[0].weight.detach().clone() for m in trials]
    state = StackedState(nn.Module(), trials, [0, 1], pad_widths=True)
    assert state.params["0.weight"].shape == (2, 6, 3)
    assert state.is_padded
    assert trials[0][0].weight.shape == (4, 3)
    assert torch.equal(trials[0][0].weight, own[0])
    assert state.params["0.weight"][0, 4:].count_nonzero() == 0  # padding is zero
    assert state.params["3.weight"][0, :, 4:].count_nonzero() == 0
    assert trials[0][1].running_var.shape == (4,)
    with torch.no_grad():
        state.params["0.weight"][0, :4].fill_(7.0)  # the trial module sees its row: a view, not a copy
    assert bool((trials[0][0].weight == 7.0).all())
    assert state.region("0.weight", 1) is None  # the widest trial fills its row


def test_gradients_are_distributed_at_each_trial_s_width() -> None:
    trials = [mlp(4, 0), mlp(6, 1)]
    state = StackedState(nn.Module(), trials, [0, 1], pad_widths=True)
    state.params["0.weight"].grad = torch.ones(2, 6, 3)
    state.distribute_grads()
    assert trials[0][0].weight.grad.shape == (4, 3)
    assert trials[1][0].weight.grad.shape == (6, 3)


def test_removing_the_widest_shrinks_and_a_wider_newcomer_widens_the_group() -> None:
    trials = [mlp(4, 0), mlp(6, 1), mlp(5, 2)]
    weights = [m[3].weight.detach().clone() for m in trials]
    state = StackedState(nn.Module(), trials, [0, 1, 2], pad_widths=True)
    (removed,) = state.remove([1])
    assert removed[0].weight.shape == (6, 3)  # the removed trial keeps a copy at its own width
    assert state.params["3.weight"].shape == (2, 2, 5)
    state.append(mlp(9, 3), 3)
    assert state.params["3.weight"].shape == (3, 2, 9)
    assert torch.equal(trials[0][3].weight, weights[0])
    assert torch.equal(trials[2][3].weight, weights[2])
    assert state.params["3.weight"][0, :, 4:].count_nonzero() == 0


def test_padding_allows_only_sizes_to_differ() -> None:
    other = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2, bias=False))
    with pytest.raises(
        ArchitectureMismatchError,
        match=r"Trial 1 cannot be fused with trial 0: parameter '3\.bias' is "
        r"missing",
    ):
        StackedState(nn.Module(), [mlp(4, 0), other], [0, 1], pad_widths=True)
    flat = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    flat[3].weight = nn.Parameter(torch.zeros(8))
    with pytest.raises(
        ArchitectureMismatchError,
        match=r"parameter '3\.weight' is \[8\] torch\.float32 "
        r"requires_grad=True, expected 2 dimensions of any size",
    ):
        StackedState(nn.Module(), [mlp(4, 0), flat], [0, 1], pad_widths=True)
    state = StackedState(nn.Module(), [mlp(4, 0)], [0], pad_widths=True)
    with pytest.raises(ArchitectureMismatchError, match=r"Trial 5 cannot be fused with the group"):
        state.append(other, 5)
