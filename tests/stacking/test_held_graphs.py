import torch
from torch import nn

from lightning_hydro.stacking.held_graphs import held_graph_tensors, release_held_graphs


class Keeper(nn.Module):
    """Keeps what its steps computed, in the places published modules keep it."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(2, 1)
        self.inner = nn.Sequential(nn.Linear(2, 2))
        self.outputs: list = []
        self.by_name: dict = {}
        self.pair: tuple = ()
        self.generated = None
        self.clean = torch.zeros(2)


def test_tensors_with_graphs_are_found_in_attributes_lists_dicts_tuples_and_submodules_and_released():
    module = Keeper()
    y = module.net(torch.ones(2))
    module.outputs += [y, {"loss": y * 2, "n": 3}]
    module.by_name["x"] = [y + 1, y.detach()]
    module.pair = (y * 3, 1)
    module.generated = y - 1
    module.inner[0].seen = y * 4
    module.outputs.append(module.outputs)  # a cycle is walked once
    assert len(list(held_graph_tensors(module))) == 6
    release_held_graphs(module)
    left = list(held_graph_tensors(module))
    assert [(container, key) for container, key, _ in left] == [(None, 0)]  # a tuple cannot be changed in place
    assert module.outputs[1]["loss"].grad_fn is None
    assert module.generated.grad_fn is None
    assert float(module.by_name["x"][0]) == float(y + 1)  # the values stay
    assert module.inner[0].seen.grad_fn is None
    assert module.net.weight.requires_grad
    assert module.clean.grad_fn is None


def test_a_row_unbound_from_a_tensor_changed_in_place_since_is_found_and_released():
    # what an nn.LSTM keeps in _flat_weights after the loop backend's functional_call and the optimizer's step:
    # torch then raises on reading the row's grad_fn ("Output 1 of Unbind is a view and its base ... modified")
    stacked = torch.randn(3, 4, requires_grad=True)
    module = nn.Linear(4, 1)
    module.rows = list(stacked.unbind(0))
    with torch.no_grad():
        stacked.add_(1.0)
    assert [key for _, key, _ in held_graph_tensors(module)] == [0, 1, 2]
    release_held_graphs(module)
    assert not any(row.requires_grad for row in module.rows)
    assert list(held_graph_tensors(module)) == []
    assert torch.equal(module.rows[1], stacked.detach()[1])  # the same values (a view shares its base's storage)
