import copy
import pickle

import pytest
import torch
from mup import MuReadout
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro.scaling import ReadoutScale, Surrogate


class TwoHeads(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.body = nn.Linear(4, width)
        self.head = nn.Linear(width, 3)
        self.aux = nn.Linear(width, 1)

    def forward(self, x):
        h = self.body(x).relu()
        return self.head(h) + self.aux(h)


class RawPositions(nn.Module):
    """A position table as a raw parameter: from its shape alone it could be a readout weight."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.positions = nn.Parameter(torch.randn(8, width))
        self.body = nn.Linear(width, width)
        self.head = nn.Linear(width, 5)

    def forward(self, x):
        return self.head(self.body(x + self.positions))


class NoReadout(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.body = nn.Linear(4, width)
        self.out = nn.Parameter(torch.randn(width, 3))

    def forward(self, x):
        return self.body(x) @ self.out


class CustomReadout(nn.Module):
    """A readout that is not an nn.Linear: a module holding a [out, width] weight."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, width) / width**0.5)

    def forward(self, x):
        return x @ self.weight.T


class WithCustomReadout(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.body = nn.Linear(4, width)
        self.readout = CustomReadout(width)

    def forward(self, x):
        return self.readout(self.body(x).relu())


class Tied(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, width)
        self.body = nn.Linear(width, width)
        self.head = nn.Linear(width, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, codes):
        return self.head(self.body(self.embed(codes)))


class UsesMuReadout(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.body = nn.Linear(4, width)
        self.head = MuReadout(width, 3)


def test_every_layer_mapping_width_to_a_fixed_size_is_a_readout():
    model = Surrogate(TwoHeads, width="width", ratio=4).build(width=16)
    assert model.width_scaling.readouts == ("head", "aux")
    for name in ("head", "aux"):
        assert torch.count_nonzero(getattr(model, name).weight) == 0
        (hook,) = getattr(model, name)._forward_pre_hooks.values()
        assert hook.multiplier == 4.0


def test_ambiguous_parameter_names_itself_and_the_fix():
    with pytest.raises(
        ValueError,
        match=r"cannot tell from its shape whether parameter 'positions' \(base shape \[None, 16\].*"
        r"readout=\['head'\]",
    ):
        Surrogate(RawPositions, width="width", ratio=2).build(width=16)


def test_naming_the_readout_resolves_the_ambiguity():
    model = Surrogate(RawPositions, width="width", ratio=2, readout=["head"]).build(width=16)
    assert model.width_scaling.readouts == ("head",)
    assert torch.count_nonzero(model.positions) > 0


def test_a_model_without_readout_is_an_error():
    with pytest.raises(ValueError, match=r"cannot tell from its shape whether parameter 'out'"):
        Surrogate(NoReadout, width="width", ratio=2).build(width=16)

    class WidthOut(nn.Module):
        def __init__(self, width: int = 16) -> None:
            super().__init__()
            self.body = nn.Linear(4, width)

    with pytest.raises(ValueError, match=r"cannot find the readout: no nn.Linear or convolution maps a width"):
        Surrogate(WidthOut, width="width", ratio=2).build(width=16)


def test_a_custom_readout_module_can_be_named():
    model = Surrogate(WithCustomReadout, width="width", ratio=4, readout="readout").build(width=16)
    assert torch.count_nonzero(model.readout.weight) == 0
    with torch.no_grad():
        model.readout.weight.normal_()
    x = torch.randn(2, 4)
    torch.testing.assert_close(model(x), 4.0 * model.body(x).relu() @ model.readout.weight.T)


def test_named_readouts_are_checked():
    with pytest.raises(ValueError, match=r"readout 'heed' is not a submodule of the model.*'head'"):
        Surrogate(TwoHeads, width="width", readout=["heed"]).build(width=16)
    with pytest.raises(ValueError, match=r"'body' is not a readout: a readout maps a width dimension to a fixed"):
        Surrogate(TwoHeads, width="width", readout=["body", "head", "aux"]).build(width=16)
    with pytest.raises(
        ValueError, match=r"'aux' also maps a width dimension to a fixed size.*readout=\['head', 'aux'\]"
    ):
        Surrogate(TwoHeads, width="width", readout=["head"]).build(width=16)


def test_mup_readout_is_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"'head' is a mup.MuReadout.*Use a plain nn.Linear"):
        Surrogate(UsesMuReadout, width="width").build(width=16)


def test_tied_readout_keeps_the_shared_weight():
    torch.manual_seed(0)
    model = Surrogate(Tied, width="width", ratio=2).build(width=16)
    assert model.width_scaling.readouts == ("head",)
    assert model.head.weight is model.embed.weight
    assert torch.count_nonzero(model.embed.weight) > 0  # not zeroed: the embedding uses it too
    (hook,) = model.head._forward_pre_hooks.values()
    assert hook.multiplier == 2.0


def test_readout_scale_works_under_vmap_deepcopy_and_pickle():
    heads = []
    for seed in range(3):
        torch.manual_seed(seed)
        head = nn.Linear(4, 2)
        head.register_forward_pre_hook(ReadoutScale(8.0))
        heads.append(head)
    params, buffers = stack_module_state(heads)
    template = copy.deepcopy(heads[0]).to("meta")
    x = torch.randn(5, 4)
    out = vmap(lambda p, b: functional_call(template, (p, b), (x,)))(params, buffers)
    for index, head in enumerate(heads):
        torch.testing.assert_close(out[index], head(x))
    clone = pickle.loads(pickle.dumps(heads[0]))
    torch.testing.assert_close(clone(x), heads[0](x))
    assert repr(ReadoutScale(2)) == "ReadoutScale(2.0)"
