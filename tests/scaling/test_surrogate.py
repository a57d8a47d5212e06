import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_hydro.demos.digits import DigitsMLP
from lightning_hydro.scaling import ReadoutScale, Surrogate
from lightning_hydro.scaling.width_scaling import fold_multipliers

from .stacking import StackedTrials, vmapped_forward


def surrogate(ratio: int = 4, **kwargs) -> Surrogate:
    return Surrogate(lambda **hp: DigitsMLP(**hp), width=["hidden_dim"], ratio=ratio, **kwargs)


def test_build_scales_the_width_and_records_the_scaling():
    model = surrogate().build(hidden_dim=256, lr=0.1)
    assert model.hparams.hidden_dim == 64
    scaling = model.width_scaling
    assert scaling.ratio == 4
    assert scaling.width_mult == 0.25
    assert scaling.widths == {"hidden_dim": 256}
    assert scaling.readouts == ("head",)
    assert scaling.base_shapes["body.2.weight"] == (256, 256)
    assert scaling.base_shapes["body.0.weight"] == (256, None)


def test_width_defaults_to_the_models_own_value():
    model = surrogate(ratio=2).build(lr=0.1)  # DigitsMLP's default hidden_dim is 64
    assert model.hparams.hidden_dim == 32
    assert model.width_scaling.widths == {"hidden_dim": 64}


def test_readout_is_zero_and_scaled_by_the_ratio():
    model = surrogate().build(hidden_dim=256)
    assert torch.count_nonzero(model.head.weight) == 0
    hooks = list(model.head._forward_pre_hooks.values())
    assert len(hooks) == 1
    assert isinstance(hooks[0], ReadoutScale)
    assert hooks[0].multiplier == 4.0
    with torch.no_grad():
        model.head.weight.normal_()
    x = torch.randn(5, 64)
    expected = F.linear(4.0 * model.body(x), model.head.weight, model.head.bias)
    torch.testing.assert_close(model(x), expected)


def test_ratio_one_is_the_plain_model_with_a_zero_readout():
    torch.manual_seed(0)
    plain = DigitsMLP(hidden_dim=128, lr=0.1)
    torch.manual_seed(0)
    target = surrogate().build(hidden_dim=128, lr=0.1, ratio=1)
    assert target.width_scaling.width_mult == 1.0
    for (name, p), q in zip(plain.named_parameters(), target.parameters()):
        if name.startswith("head"):
            assert torch.count_nonzero(q) == 0
        else:
            torch.testing.assert_close(p, q)
    assert not target.head._forward_pre_hooks
    groups = target.configure_optimizers().param_groups
    assert [g["lr"] for g in groups] == [0.1]


def test_zero_readout_false_rescales_the_default_init():
    torch.manual_seed(0)
    plain = DigitsMLP(hidden_dim=64)
    torch.manual_seed(0)
    model = surrogate(zero_readout=False).build(hidden_dim=256)
    torch.testing.assert_close(model.head.weight, plain.head.weight * 0.5)


def test_hidden_biases_are_rescaled_to_their_full_size_scale():
    torch.manual_seed(0)
    plain = DigitsMLP(hidden_dim=64)
    torch.manual_seed(0)
    model = surrogate().build(hidden_dim=256)
    torch.testing.assert_close(model.body[2].bias, plain.body[2].bias * 0.5)  # fan-in 64 of base 256
    torch.testing.assert_close(model.body[0].bias, plain.body[0].bias)  # fan-in 64 features: fixed
    torch.testing.assert_close(model.body[2].weight, plain.body[2].weight)  # fan-in init is already muP


@pytest.mark.parametrize(("optimizer", "expected"), [("adam", {1.0, 4.0}), ("sgd", {1.0, 0.25})])
def test_configure_optimizers_carries_mup_multipliers(optimizer, expected):
    model = surrogate().build(hidden_dim=256, lr=0.1, optimizer=optimizer, weight_decay=0.01)
    groups = model.configure_optimizers().param_groups
    assert {g["mup_lr_mult"] for g in groups} == expected
    for group in groups:
        assert group["lr"] == pytest.approx(0.1 * group["mup_lr_mult"])
        assert group["weight_decay"] == pytest.approx(0.01 * group["mup_wd_mult"])
    hidden = next(g for g in groups if any(p is model.body[2].weight for p in g["params"]))
    assert hidden["mup_lr_mult"] == (4.0 if optimizer == "adam" else 1.0)


def test_stacked_surrogates_under_vmap_match_unfused_outputs():
    s = surrogate()
    models = []
    for seed in range(4):
        torch.manual_seed(seed)
        model = s.build(hidden_dim=256, lr=0.1)
        with torch.no_grad():
            model.head.weight.normal_()  # a zero readout would make the comparison trivial
        models.append(model)
    x = torch.randn(7, 64)
    fused = vmapped_forward(models, x)
    for index, model in enumerate(models):
        torch.testing.assert_close(fused[index], model(x))


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_fused_training_matches_separate_training(optimizer):
    s = surrogate()
    lrs = [0.01, 0.03, 0.1]

    def build(lr: float) -> DigitsMLP:
        torch.manual_seed(0)
        return s.build(hidden_dim=256, lr=lr, optimizer=optimizer)

    separate = [build(lr) for lr in lrs]
    fused = StackedTrials([build(lr) for lr in lrs], lambda out, batch: F.cross_entropy(out, batch[1]))
    opts = [m.configure_optimizers() for m in separate]
    torch.manual_seed(1)
    batches = [(torch.rand(16, 64), torch.randint(0, 10, (16,))) for _ in range(3)]
    for batch in batches:
        fused(batch)
        for model, opt in zip(separate, opts):
            opt.zero_grad()
            F.cross_entropy(model(batch[0]), batch[1]).backward()
            opt.step()
    for a, b in zip(separate, fused.models):
        for p, q in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert torch.count_nonzero(fused.models[0].head.weight) > 0  # the readout trained


def test_trials_survive_deepcopy_like_unfuse():
    model = surrogate().build(hidden_dim=256, lr=0.1, optimizer="adam")
    twin = copy.deepcopy(model)
    assert twin.width_scaling == model.width_scaling
    groups = twin.configure_optimizers().param_groups
    params = {id(p) for g in groups for p in g["params"]}
    assert params == {id(p) for p in twin.parameters()}  # the copy's parameters, not the original's
    assert twin.head._forward_pre_hooks[next(iter(twin.head._forward_pre_hooks))].multiplier == 4.0


def test_readout_can_be_named_explicitly():
    model = surrogate(readout="head").build(hidden_dim=256)
    assert model.width_scaling.readouts == ("head",)


def test_unknown_optimizer_needs_an_explicit_rule():
    class Lion(torch.optim.SGD):
        pass

    class Custom(torch.optim.Optimizer):
        def __init__(self, params, lr: float) -> None:
            super().__init__(params, {"lr": lr})

    model = surrogate().build(hidden_dim=256)
    optimizer = Custom(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"no muP learning-rate rule for optimizer Custom.*optimizer_rules"):
        fold_multipliers(model, optimizer)
    ruled = surrogate(optimizer_rules={Custom: "adam"}).build(hidden_dim=256)
    groups = fold_multipliers(ruled, Custom(ruled.parameters(), lr=0.1)).param_groups
    assert {g["mup_lr_mult"] for g in groups} == {1.0, 4.0}
    sgd_like = fold_multipliers(ruled, Lion(ruled.parameters(), lr=0.1)).param_groups  # inherits SGD's rule
    assert {g["mup_lr_mult"] for g in sgd_like} == {1.0, 0.25}


@pytest.mark.parametrize("ratio", [0, -2, 1.5, True, "4"])
def test_ratio_must_be_a_positive_int(ratio):
    with pytest.raises(ValueError, match=r"ratio must be an int >= 1 .* got"):
        surrogate(ratio=ratio)
    with pytest.raises(ValueError, match=r"ratio must be an int >= 1"):
        surrogate().build(hidden_dim=256, ratio=ratio)


def test_ratio_must_divide_the_width():
    with pytest.raises(ValueError, match=r"ratio 3 does not divide hidden_dim=256; the surrogate's hidden_dim would"):
        surrogate(ratio=3).build(hidden_dim=256)


def test_width_keys_must_exist():
    s = Surrogate(DigitsMLP, width=["hidden"], ratio=2)
    with pytest.raises(
        ValueError, match=r"width key 'hidden' is not a hyperparameter of the model.*build\(hidden=256\)"
    ):
        s.build()
    with pytest.raises(ValueError, match=r"building the model with .*'hidden': 256.* failed.*unexpected keyword"):
        s.build(hidden=256)


def test_width_keys_must_change_a_shape():
    s = Surrogate(DigitsMLP, width=["hidden_dim", "depth"], ratio=1)
    with pytest.raises(ValueError, match=r"changing width key 'depth' from 2 to 4 adds or removes parameters"):
        s.build()

    class Ignores(nn.Module):
        def __init__(self, hidden_dim: int = 8, unused: int = 4) -> None:
            super().__init__()
            self.body = nn.Linear(3, hidden_dim)
            self.head = nn.Linear(hidden_dim, 2)

    with pytest.raises(ValueError, match=r"width key 'unused' does not change any parameter shape"):
        Surrogate(Ignores, width=["hidden_dim", "unused"]).build(hidden_dim=8, unused=4)


def test_width_values_must_be_positive_ints():
    with pytest.raises(ValueError, match=r"width hyperparameter 'hidden_dim' must be a positive int, got 64.0"):
        surrogate().build(hidden_dim=64.0)


def test_width_must_name_keys():
    with pytest.raises(ValueError, match=r"width must name at least one width hyperparameter, got \[\]"):
        Surrogate(DigitsMLP, width=[])


def test_optimizer_rules_are_checked():
    with pytest.raises(TypeError, match=r"optimizer_rules must be keyed by optimizer classes, got 'adam'"):
        Surrogate(DigitsMLP, width="hidden_dim", optimizer_rules={"adam": "adam"})
    with pytest.raises(ValueError, match=r"optimizer rule for SGD must be one of \('adam', 'sgd'\), got 'lion'"):
        Surrogate(DigitsMLP, width="hidden_dim", optimizer_rules={torch.optim.SGD: "lion"})


def test_repr_names_the_settings():
    assert repr(surrogate()) == "Surrogate(width=['hidden_dim'], ratio=4, readout=None)"
