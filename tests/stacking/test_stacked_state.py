import pytest
import torch
from torch import nn

from lightning_hydro.stacking.stacked_state import ArchitectureMismatchError, StackedState, check_same_architecture


def bn_net() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_parameters_and_buffers_are_stacked_and_bound():
    storage = nn.Module()
    trials = [bn_net() for _ in range(3)]
    state = StackedState(storage, trials, [10, 11, 12])
    assert set(state.params) == {"0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"}
    assert state.buffers["1.running_mean"].shape == (3, 4)
    assert state.buffers["1.num_batches_tracked"].shape == (3,)
    assert storage.get_parameter("0__weight") is state.params["0.weight"]
    with torch.no_grad():
        state.buffers["1.running_mean"][2].fill_(7.0)
        state.params["2.bias"][1].fill_(3.0)
    assert torch.all(trials[2][1].running_mean == 7.0)
    assert torch.all(trials[1][2].bias == 3.0)
    assert state.row_of(11) == 1
    with pytest.raises(KeyError, match=r"Trial 99 is not in this group; live trials: \[10, 11, 12\]"):
        state.row_of(99)


def test_gradients_are_distributed_as_views():
    storage = nn.Module()
    trials = [nn.Linear(2, 2) for _ in range(2)]
    state = StackedState(storage, trials, [0, 1])
    state.params["weight"].grad = torch.arange(8.0).view(2, 2, 2)
    state.distribute_grads()
    assert trials[1].weight.grad.data_ptr() == state.params["weight"].grad[1].data_ptr()
    assert trials[0].bias.grad is None  # no stacked gradient: none for the trial either


def test_remove_compacts_and_detaches():
    storage = nn.Module()
    trials = [nn.Linear(2, 2) for _ in range(3)]
    originals = [t.weight.detach().clone() for t in trials]
    state = StackedState(storage, trials, [0, 1, 2])
    weight = state.params["weight"]
    (removed,) = state.remove([1])
    assert removed is trials[1]
    assert state.params["weight"] is weight  # same Parameter object, new rows
    assert weight.shape == (2, 2, 2)
    assert state.trial_ids == [0, 2]
    assert torch.equal(trials[2].weight, originals[2])
    with torch.no_grad():
        weight.zero_()
    assert torch.equal(trials[1].weight, originals[1])  # detached: owns its weights now
    assert torch.all(trials[2].weight == 0)


def test_append_and_reorder():
    storage = nn.Module()
    trials = [bn_net() for _ in range(2)]
    state = StackedState(storage, trials, [0, 1])
    newcomer = bn_net()
    state.append(newcomer, 5)
    assert state.trial_ids == [0, 1, 5]
    assert torch.equal(state.params["0.weight"][2], newcomer[0].weight)
    assert storage.get_buffer("1__running_var").shape == (3, 4)
    state.reorder([5, 0])
    assert state.trial_ids == [5, 0]
    assert torch.equal(state.params["0.weight"][0], newcomer[0].weight)
    with pytest.raises(ArchitectureMismatchError, match="Trial 6 cannot be fused with the group"):
        state.append(nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5), nn.Linear(5, 2)), 6)


def test_non_persistent_buffers_stay_out_of_the_state_dict():
    class WithCache(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 2)
            self.register_buffer("cache", torch.zeros(2), persistent=False)

    storage = nn.Module()
    StackedState(storage, [WithCache(), WithCache()], [0, 1])
    assert "cache" not in storage.state_dict()
    assert storage.get_buffer("cache").shape == (2, 2)


def test_architecture_checks_cover_requires_grad():
    frozen = nn.Linear(2, 2)
    frozen.weight.requires_grad_(False)
    with pytest.raises(ArchitectureMismatchError, match=r"requires_grad=False, expected .* requires_grad=True"):
        check_same_architecture([nn.Linear(2, 2), frozen])


def test_a_group_without_rows_takes_recorded_shapes_and_grows_again():
    storage = nn.Module()
    state = StackedState(storage, [nn.Linear(3, 2), nn.Linear(3, 2)], trial_ids=[0, 1])
    with pytest.raises(ValueError, match=r"reshape_empty: only a group without rows .* this one has 2 rows"):
        state.reshape_empty({"weight": (0, 2, 3)})
    state.remove([0, 1])
    with pytest.raises(ValueError, match=r"the shapes asked for have \[1\] rows"):
        state.reshape_empty({"weight": (1, 2, 3)})
    state.reshape_empty({"weight": (0, 2, 3), "bias": (0, 2)})
    assert storage.state_dict()["weight"].shape == (0, 2, 3)
    newcomer = nn.Linear(3, 2)
    state.append(newcomer, 5)
    assert torch.equal(state.params["weight"][0], newcomer.weight)


@pytest.mark.parametrize("change", ["remove", "append"])
def test_a_backward_after_the_rows_change_works_while_a_graph_of_the_old_rows_is_alive(change):
    # a graph kept alive (a loss in an outputs list) holds the stacked parameters' gradient accumulators, made for
    # the old number of rows; torch hands them to every later backward unless the parameter forgets them
    storage = nn.Module()
    trials = [nn.Linear(3, 2) for _ in range(3)]
    state = StackedState(storage, trials, [0, 1, 2])
    x = torch.randn(3, 5, 3)
    kept = torch.func.vmap(torch.func.functional_call, in_dims=(None, 0, 0))(trials[0], dict(state.params), x).sum()
    if change == "remove":
        state.remove([1])
    else:
        state.append(nn.Linear(3, 2), 3)
    rows = state.size
    out = torch.func.vmap(torch.func.functional_call, in_dims=(None, 0, 0))(
        trials[0], dict(state.params), torch.randn(rows, 5, 3)
    )
    out.sum().backward()
    assert state.params["weight"].grad.shape == (rows, 2, 3)
    assert kept.grad_fn is not None  # the old graph was still alive
    # a change that keeps the shape (the rows reordered) keeps the accumulator: a graph made before still fits
    state.reorder(list(reversed(state.trial_ids)))
    kept_now = (state.params["weight"] * 2).sum()
    state.reorder(list(reversed(state.trial_ids)))
    kept_now.backward()
    assert state.params["weight"].grad.shape == (rows, 2, 3)


def test_replaced_buffers_leave_the_old_tensor_to_a_graph_that_saved_it_and_bind_the_trials():
    trials = [nn.BatchNorm1d(2) for _ in range(3)]
    state = StackedState(nn.Module(), trials, trial_ids=[0, 1, 2])
    weight = torch.ones(3, 2, requires_grad=True)
    out = (weight * state.buffers["running_var"]).sum()  # the backward needs the old running_var
    new = state.with_rows("running_var", {1: torch.tensor([5.0, 6.0])})
    state.replace_buffers({"running_var": new})
    out.backward()  # a copy into the old tensor would fail here ("modified by an inplace operation")
    assert trials[1].running_var.tolist() == [5.0, 6.0]
    assert trials[0].running_var.tolist() == [1.0, 1.0]
    trials[2].running_var = torch.tensor([7.0, 8.0])  # a hook's reassignment on the trial module
    state.adopt_reassigned_buffers()
    assert state.buffers["running_var"][2].tolist() == [7.0, 8.0]
    assert (
        trials[2].running_var.untyped_storage().data_ptr() == state.buffers["running_var"].untyped_storage().data_ptr()
    )
