import pytest
from torch import nn

from lightning_hydro.backends.hfta import FUSED_OPERATORS
from lightning_hydro.backends.hfta.registry import is_groupable


def test_every_fused_operator_fuses_its_own_torch_class() -> None:
    for torch_class, fused_class in FUSED_OPERATORS.items():
        assert fused_class.fused_from is torch_class
        assert issubclass(fused_class, torch_class)


@pytest.mark.parametrize(
    ("module", "groupable"),
    [
        (nn.ELU(), True),
        (nn.Softmax(dim=1), True),
        (nn.Flatten(), True),
        (nn.PReLU(), False),  # has a parameter
        (nn.MultiheadAttention(4, 1), False),
        (nn.Linear(2, 2), False),
        (nn.Sequential(), False),  # not a torch file of per-element modules
    ],
)
def test_is_groupable(module: nn.Module, groupable: bool) -> None:
    assert is_groupable(module) is groupable
