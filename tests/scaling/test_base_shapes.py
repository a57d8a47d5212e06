import pytest
import torch
from torch import nn

from lightning_hydro.demos.char_lm import CharTransformer
from lightning_hydro.demos.digits import DigitsMLP
from lightning_hydro.scaling.base_shapes import (
    build_on_meta,
    find_base_shapes,
    infshapes,
    parameter_shapes,
    resolve_widths,
)


def test_digits_base_shapes_mark_the_width_dimensions():
    base = find_base_shapes(DigitsMLP, {"depth": 2}, {"hidden_dim": 256})
    assert base == {
        "body.0.weight": (256, None),
        "body.0.bias": (256,),
        "body.2.weight": (256, 256),
        "body.2.bias": (256,),
        "head.weight": (None, 256),
        "head.bias": (None,),
    }


def test_transformer_base_shapes_follow_derived_sizes():
    base = find_base_shapes(CharTransformer, {"n_layers": 1}, {"d_model": 64})
    assert base["blocks.0.qkv.weight"] == (192, 64)
    assert base["blocks.0.mlp.0.weight"] == (256, 64)
    assert base["tokens.weight"] == (None, 64)
    assert base["head.weight"] == (None, 64)


def test_two_width_keys_are_probed_one_at_a_time():
    class TwoWidths(nn.Module):
        def __init__(self, width: int = 8, inner: int = 16) -> None:
            super().__init__()
            self.a = nn.Linear(3, width)
            self.b = nn.Linear(width, inner)
            self.c = nn.Linear(inner, 2)

    base = find_base_shapes(TwoWidths, {}, {"width": 8, "inner": 16})
    assert base["b.weight"] == (16, 8)
    assert base["c.weight"] == (None, 16)


def test_infshapes_relate_a_surrogate_to_its_base():
    base = find_base_shapes(DigitsMLP, {}, {"hidden_dim": 256})
    shapes = infshapes(base, DigitsMLP(hidden_dim=64))
    assert shapes["body.2.weight"].width_mult() == 0.25
    assert shapes["body.2.weight"].ninf() == 2
    assert shapes["head.weight"].ninf() == 1
    assert shapes["head.bias"].ninf() == 0


def test_infshapes_need_the_same_parameters():
    base = find_base_shapes(DigitsMLP, {"depth": 2}, {"hidden_dim": 256})
    with pytest.raises(ValueError, match=r"parameters differ from those its base shapes were found for.*body.4"):
        infshapes(base, DigitsMLP(hidden_dim=64, depth=3))


def test_probes_are_built_on_meta_without_memory():
    model = build_on_meta(DigitsMLP, {"hidden_dim": 4096})
    assert all(p.device.type == "meta" for p in model.parameters())
    assert parameter_shapes(model)["body.2.weight"] == (4096, 4096)


def test_models_that_need_real_tensors_are_built_normally():
    class ReadsData(nn.Module):
        def __init__(self, width: int = 4) -> None:
            super().__init__()
            self.layer = nn.Linear(2, width)
            self.scale = float(self.layer.weight.detach().abs().max())  # .item() cannot run on meta

    assert build_on_meta(ReadsData, {"width": 4}).layer.weight.device.type == "cpu"


def test_widths_come_from_hparams_then_from_the_model():
    assert resolve_widths(DigitsMLP, {"hidden_dim": 32}, ["hidden_dim"]) == {"hidden_dim": 32}
    assert resolve_widths(DigitsMLP, {}, ["hidden_dim"]) == {"hidden_dim": 64}

    class Attribute(nn.Module):
        def __init__(self, width: int = 12) -> None:
            super().__init__()
            self.width = width

    assert resolve_widths(Attribute, {}, ["width"]) == {"width": 12}


def test_width_changing_the_rank_of_a_parameter_is_an_error():
    class Reshapes(nn.Module):
        def __init__(self, width: int = 8) -> None:
            super().__init__()
            shape = (width,) if width < 10 else (2, width // 2)
            self.w = nn.Parameter(torch.zeros(shape))

    with pytest.raises(ValueError, match=r"changes the number of dimensions of 'w' \(\(8,\) -> \(2, 8\)\)"):
        find_base_shapes(Reshapes, {}, {"width": 8})
