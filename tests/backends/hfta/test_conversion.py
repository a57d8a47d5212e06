import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro.backends.hfta import (
    ConversionError,
    FusedCallError,
    convert_to_fused,
    plan_conversion,
    select_trials,
)
from lightning_hydro.backends.hfta.convolution import FusedConv2d
from lightning_hydro.backends.hfta.linear import FusedLinear
from lightning_hydro.backends.hfta.trial_grouped_module import TrialGroupedModule

from .fusion_check import assert_close


class Scale(nn.Module):
    """A user module with a parameter and a Python setting."""

    def __init__(self, factor: float = 2.0) -> None:
        super().__init__()
        self.factor = factor
        self.weight = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight * self.factor


class ScaledLinear(nn.Linear):
    """A subclass with its own forward (as mup's readout): must not be fused as a plain Linear."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return super().forward(input) * 0.5


class Net(nn.Module):
    def __init__(self, slope: float = 0.1, alpha: float = 1.0, factor: float = 2.0, note: str = "a") -> None:
        super().__init__()
        self.note = note
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.act = nn.LeakyReLU(slope)
        self.elu = nn.ELU(alpha)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.scale = Scale(factor)
        self.head = ScaledLinear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(self.elu(self.act(self.conv(x)))).flatten(1)
        return self.head(self.scale(h))


def outcomes(trials: list[nn.Module]) -> dict[str, str]:
    return {decision.path: decision.outcome for decision in plan_conversion(trials[0], trials).decisions}


def test_plan_fuses_what_it_can_groups_differing_settings_and_leaves_the_rest_native() -> None:
    trials = [Net(alpha=alpha, note=note) for alpha, note in ((1.0, "a"), (0.5, "b"))]
    plan = plan_conversion(trials[0], trials)
    assert outcomes(trials) == {
        "conv": "fused",
        "act": "native",
        "elu": "grouped",
        "pool": "fused",
        "scale": "native",
        "head": "native",
    }
    assert plan.unverified == ("module '' (Net): note = ['a', 'b']",)
    summary = plan.summary()
    assert "native   module 'scale' (Scale): no fused operator for Scale" in summary
    assert "unverified module '' (Net): note = ['a', 'b']" in summary


def test_converted_model_keeps_names_and_weights_and_matches_the_trials() -> None:
    trials = [Net(slope=slope, alpha=alpha) for slope, alpha in ((0.1, 1.0), (0.3, 0.5), (0.1, 0.5))]
    template = copy.deepcopy(trials[0])
    model = convert_to_fused(template, trials)
    assert model is not template
    assert type(template.conv) is nn.Conv2d
    assert isinstance(model.conv, FusedConv2d)
    assert isinstance(model.elu, TrialGroupedModule)
    assert type(model.head) is ScaledLinear
    assert list(dict(model.named_parameters())) == list(dict(template.named_parameters()))
    for (name, converted), original in zip(model.named_parameters(), template.parameters()):
        assert torch.equal(converted, original), f"{name} was re-initialised"
    params, buffers = stack_module_state(trials)
    x = torch.randn(4, 3, 5, 5)
    out = vmap(lambda p, b: functional_call(model, (p, b), (x,)), in_dims=(0, 0))(params, buffers)
    for slot, trial in enumerate(trials):
        assert_close(out[slot], trial(x), f"trial {slot}")


def test_inplace_conversion_returns_the_template_itself() -> None:
    trials = [nn.Sequential(nn.Linear(2, 2)) for _ in range(2)]
    template = copy.deepcopy(trials[0])
    assert convert_to_fused(template, trials, inplace=True) is template
    assert isinstance(template[0], FusedLinear)


@pytest.mark.parametrize(
    ("trials", "message"),
    [
        (
            [nn.Sequential(nn.Conv2d(2, 2, 3, padding=p)) for p in (0, 1)],
            r"module '0' \(Conv2d\): trials differ in padding = \[\(0, 0\), \(1, 1\)\], which a fused Conv2d "
            r"cannot honour per trial \(it does for: nothing\)",
        ),
        (
            [nn.Sequential(Scale(f)) for f in (1.0, 2.0)],
            r"module '0' \(Scale\): trials differ in factor = \[1.0, 2.0\], and no fused operator honours "
            r"that; vmap would run every trial with the template's values",
        ),
        (
            [nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.Tanh())],
            r"module '0' \(Linear\): trials have \{1: 'Tanh'\} here \(slot: type\); all trials must share",
        ),
        (
            [nn.Sequential(nn.Embedding(5, 2, sparse=True)) for _ in range(2)],
            r"module '0' \(Embedding\): sparse=True: sparse gradients cannot be stacked over trials",
        ),
        (
            [nn.Sequential(nn.MultiheadAttention(4, 1, dropout=p, add_bias_kv=True)) for p in (0.0, 0.1)],
            r"module '0' \(MultiheadAttention\): add_bias_kv/add_zero_attn are not fused and trials differ "
            r"in dropout",
        ),
    ],
)
def test_unfusable_trials_are_rejected_with_path_type_and_advice(trials: list[nn.Module], message: str) -> None:
    with pytest.raises(ConversionError, match=message) as raised:
        convert_to_fused(trials[0], trials)
    assert "Use backend='loop' (always correct)" in str(raised.value)


def test_conversion_needs_trials() -> None:
    with pytest.raises(ValueError, match=r"plan_conversion expects at least one trial module, got an empty sequence"):
        convert_to_fused(nn.Linear(2, 2), [])


def test_a_whole_model_that_is_one_parameter_free_module_is_grouped() -> None:
    trials = [nn.ELU(alpha) for alpha in (1.0, 0.5)]
    model = convert_to_fused(trials[0], trials)
    x = -torch.ones(2, 3)
    assert isinstance(model, TrialGroupedModule)
    torch.testing.assert_close(vmap(model)(x), torch.stack([trial(x[0]) for trial in trials]))


def test_select_trials_follows_compaction_of_the_stacked_state() -> None:
    trials = [
        nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3, momentum=m), nn.Dropout(p), nn.ELU(alpha))
        for m, p, alpha in ((0.1, 0.0, 1.0), (0.5, 0.2, 0.5), (0.9, 0.0, 2.0))
    ]
    for trial in trials:
        trial.eval()  # dropout off: outputs are deterministic
    model = convert_to_fused(trials[0], trials).eval()
    select_trials(model, [2, 0])
    assert model[1].setting("momentum").values == (0.9, 0.1)
    survivors = [trials[2], trials[0]]
    params, buffers = stack_module_state(survivors)
    x = torch.randn(4, 3)
    out = vmap(lambda p, b: functional_call(model, (p, b), (x,)), in_dims=(0, 0))(params, buffers)
    for slot, trial in enumerate(survivors):
        assert_close(out[slot], trial(x), f"surviving trial {slot}")


@pytest.mark.parametrize("slots", [[], [0, 0], [3]])
def test_select_trials_rejects_bad_slots(slots: list[int]) -> None:
    trials = [nn.Sequential(nn.Linear(2, 2)) for _ in range(3)]
    model = convert_to_fused(trials[0], trials)
    with pytest.raises(ValueError, match=r"select_trials expects distinct slots in \[0, 3\), got"):
        select_trials(model, slots)


def test_running_over_a_different_number_of_trials_says_what_to_do() -> None:
    trials = [nn.Sequential(nn.Linear(2, 2)) for _ in range(3)]
    model = convert_to_fused(trials[0], trials)
    params, _ = stack_module_state(trials[:2])
    x = torch.randn(4, 2)
    with pytest.raises(FusedCallError, match=r"FusedLinear at '0' was converted for 3 trials but vmap runs over 2; "):
        vmap(lambda p: functional_call(model, p, (x,)))(params)
    grouped = convert_to_fused(nn.ELU(), [nn.ELU(1.0), nn.ELU(0.5)])
    with pytest.raises(FusedCallError, match=r"TrialGroupedModule at '' was converted for 2 trials but vmap runs"):
        vmap(grouped)(torch.zeros(3, 1))


def test_parametrized_trials_share_their_architecture_and_run_as_alone() -> None:
    # torch.nn.utils.parametrize makes a class per module (every trial's ParametrizedLinear is another class):
    # conversion refused them before, saying the trials had {1: 'ParametrizedLinear'} where the template had a
    # ParametrizedLinear; the class they were made from is what decides
    trials = []
    for seed in range(3):
        torch.manual_seed(seed)
        trials.append(nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(4, 8)), nn.ReLU(), nn.Linear(8, 2)))
    assert "rejected" not in outcomes(trials).values()
    model = convert_to_fused(trials[0], trials)
    params, buffers = stack_module_state(trials)
    x = torch.randn(5, 4)
    fused = vmap(lambda p, b: functional_call(model, (p, b), (x,)), in_dims=(0, 0))(params, buffers)
    for row, trial in enumerate(trials):
        assert_close(fused[row], trial(x), f"trial {row}")


def test_two_classes_of_one_name_are_named_in_full() -> None:
    class Linear(nn.Linear):  # the user's own Linear, named as torch's
        pass

    trials = [nn.Sequential(nn.Linear(2, 2)), nn.Sequential(Linear(2, 2))]
    with pytest.raises(ConversionError, match=r"trials have \{1: '.*test_conversion\..*Linear'\} here \(slot: type\)"):
        convert_to_fused(trials[0], trials)
