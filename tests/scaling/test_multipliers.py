import pytest
import torch
from mup import InfDim, InfShape

from lightning_hydro.scaling.multipliers import (
    DEFAULT_RULES,
    Multipliers,
    multipliers,
    optimizer_rule,
    qualified_name,
)

HIDDEN = InfShape([InfDim(256, 64), InfDim(256, 64)])
WIDE_OUT = InfShape([InfDim(1024, 256), InfDim(256, 64)])  # fan-out 4x fan-in, both at 1/4
INPUT = InfShape([InfDim(256, 64), InfDim(None, 10)])
READOUT = InfShape([InfDim(None, 10), InfDim(256, 64)])
BIAS = InfShape([InfDim(256, 64)])
FIXED = InfShape([InfDim(None, 10)])


@pytest.mark.parametrize(
    ("shape", "adam", "sgd"),
    [
        (HIDDEN, Multipliers(4.0, 0.25), Multipliers(1.0, 1.0)),
        (WIDE_OUT, Multipliers(4.0, 0.25), Multipliers(1.0, 1.0)),
        (INPUT, Multipliers(1.0, 1.0), Multipliers(0.25, 4.0)),
        (READOUT, Multipliers(1.0, 1.0), Multipliers(0.25, 4.0)),
        (BIAS, Multipliers(1.0, 1.0), Multipliers(0.25, 4.0)),
        (FIXED, Multipliers(1.0, 1.0), Multipliers(1.0, 1.0)),
    ],
)
def test_rules_match_mup(shape, adam, sgd):
    assert multipliers(shape, "adam") == adam
    assert multipliers(shape, "sgd") == sgd


def test_sgd_rule_uses_the_fan_in_over_fan_out_ratio():
    shape = InfShape([InfDim(256, 128), InfDim(256, 64)])  # fan-out 1/2, fan-in 1/4
    assert multipliers(shape, "sgd") == Multipliers(2.0, 0.5)


def test_full_size_multipliers_are_one():
    base = InfShape([InfDim(256, 256), InfDim(256, 256)])
    assert multipliers(base, "adam") == multipliers(base, "sgd") == Multipliers(1.0, 1.0)


def test_more_than_two_width_dimensions_is_an_error():
    cube = InfShape([InfDim(8, 4)] * 3)
    with pytest.raises(ValueError, match=r"shape \[4, 4, 4\] has 3 width dimensions; muP defines learning rates"):
        multipliers(cube, "adam")


def test_unknown_rule_is_an_error():
    with pytest.raises(ValueError, match=r"rule must be one of \('adam', 'sgd'\), got 'lion'"):
        multipliers(HIDDEN, "lion")  # type: ignore[arg-type]


def test_optimizer_rules_follow_the_class_hierarchy():
    p = [torch.nn.Parameter(torch.zeros(1))]
    for cls, rule in DEFAULT_RULES.items():
        assert optimizer_rule(cls(p, lr=0.1), {}) == rule

    class MyAdam(torch.optim.Adam):
        pass

    assert optimizer_rule(MyAdam(p), {}) == "adam"
    assert optimizer_rule(MyAdam(p), {qualified_name(MyAdam): "sgd"}) == "sgd"
    with pytest.raises(TypeError, match=r"no muP learning-rate rule for optimizer LBFGS. Known: .*'sgd'"):
        optimizer_rule(torch.optim.LBFGS(p), {})
