"""The width plan (issue 14 item 2): what is padded per module, and what is refused, naming module and line."""

from __future__ import annotations

import pytest
from torch import nn

from lightning_hydro.stacking.width_plan import WidthPaddingError, identical_shape_partitions, plan_widths
from tests.helpers import DigitsCNN


class Net(nn.Module):
    def __init__(self, width: int, classes: int = 10, inputs: int = 8, norm: str = "layer") -> None:
        super().__init__()
        self.body = nn.Linear(inputs, width)
        self.norm = nn.LayerNorm(width) if norm == "layer" else nn.GroupNorm(2, width)
        self.head = nn.Linear(width, classes)


def test_a_hidden_width_is_padded_in_producer_norm_and_consumer() -> None:
    plan = plan_widths([Net(8), Net(16)], ids=[3, 5])
    assert [(d.path, d.attribute, d.role, d.sizes) for d in plan.padded] == [
        ("body", "out_features", "produces", (8, 16)),
        ("norm", "normalized_shape", "passes", (8, 16)),
        ("head", "in_features", "consumes", (8, 16)),
    ]
    assert plan.refusals == []
    assert plan.width_of("norm", 1) == 16
    plan.raise_if_refused()


def test_channels_flattened_into_a_linear_match_as_a_multiple() -> None:
    plan = plan_widths([DigitsCNN(channels=4), DigitsCNN(channels=6)], ids=[0, 1])
    assert plan.refusals == []
    assert ("head", "in_features", (32, 48)) in [(d.path, d.attribute, d.sizes) for d in plan.padded]


def test_a_searched_output_size_is_refused_with_module_and_line() -> None:
    plan = plan_widths([Net(8, classes=10), Net(8, classes=12)], ids=[0, 1])
    with pytest.raises(
        WidthPaddingError,
        match=r"module 'head' \(Linear, built at .*test_width_plan\.py:\d+ in Net\): "
        r"its out_features differs between trials \(10, 12\) and no later module takes that size in",
    ):
        plan.raise_if_refused()


def test_an_input_size_that_differs_is_refused() -> None:
    plan = plan_widths([Net(8, inputs=4), Net(8, inputs=6)], ids=[0, 1])
    assert "its in_features differs between trials (4, 6) and no module produces that size" in plan.refusals[0]


def test_group_norm_over_a_padded_width_is_refused_by_name() -> None:
    plan = plan_widths([Net(8, norm="group"), Net(16, norm="group")], ids=[0, 1])
    assert plan.refusals[0].startswith("module 'norm' (GroupNorm")
    assert "GroupNorm's groups over a padded channel dimension" in plan.refusals[0]


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda w: nn.Sequential(nn.MultiheadAttention(w, 2)), "head split depends on the padded embedding size"),
        (lambda w: nn.Sequential(nn.Conv2d(2, 4, w)), "kernel size differs"),
        (lambda w: nn.Sequential(nn.Conv2d(4, w, 1, groups=2), nn.Conv2d(w, 3, 1)), "grouped convolution"),
        (lambda w: nn.Sequential(nn.Embedding(w, 4)), "number of embeddings"),
        (lambda w: nn.Sequential(nn.Linear(3, w), nn.LayerNorm([w, 2])), "LayerNorm over several dimensions"),
        (lambda w: nn.Sequential(nn.GRU(3, w)), "GRU is not a module whose width can be padded"),
    ],
)
def test_modules_whose_meaning_depends_on_the_padded_size_are_refused(make, reason: str) -> None:
    plan = plan_widths([make(4), make(6)], ids=[0, 1])
    assert any(reason in refusal for refusal in plan.refusals), plan.refusals


def test_identical_shape_partitions_is_the_fallback_grouping() -> None:
    assert identical_shape_partitions([Net(8), Net(16), Net(8), Net(16), Net(4)]) == [[0, 2], [1, 3], [4]]


def test_an_empty_group_has_an_empty_plan() -> None:
    plan = plan_widths([], ids=[])
    assert plan.padded == []
    assert plan.refusals == []
