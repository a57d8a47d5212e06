import pytest
import torch
from torch import nn

from lightning_hydro.backends.hfta.per_trial import PerTrial, values_equal


@pytest.mark.parametrize(
    ("first", "second", "equal"),
    [
        (0.1, 0.1, True),
        (0.1, 0.2, False),
        (None, None, True),
        (None, 0.1, False),
        ((1, 2), (1, 2), True),
        (torch.ones(2), torch.ones(2), True),
        (torch.ones(2), torch.ones(3), False),
        (torch.ones(2), 1.0, False),
        ("tanh", "none", False),
        ([torch.ones(2)], [torch.ones(2)], True),
        ([torch.ones(2)], [torch.zeros(2)], False),
        ((1, 2), [1, 2], False),
        ({"k": torch.ones(2)}, {"k": torch.ones(2)}, True),
        ({"k": 1}, {"j": 1}, False),
        (torch.ones(2), torch.ones(2, dtype=torch.float64), False),
    ],
)
def test_values_equal(first: object, second: object, equal: bool) -> None:
    assert values_equal(first, second) is equal


def test_per_trial_values_gather_select_and_broadcast() -> None:
    eps = PerTrial.gather([nn.LayerNorm(2, eps=e) for e in (1e-5, 1e-3, 1e-5)], "eps")
    assert len(eps) == 3
    assert not eps.is_uniform
    assert eps.first == 1e-5
    assert eps.select([2, 0]).is_uniform
    column = eps.column(torch.zeros((), dtype=torch.float64), ndim=3)
    assert column.shape == (3, 1, 1)
    assert column.dtype == torch.float64
    assert column.flatten().tolist() == [1e-5, 1e-3, 1e-5]
