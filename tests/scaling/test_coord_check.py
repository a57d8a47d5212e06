import pytest
import torch
import torch.nn.functional as F

from lightning_hydro.demos.digits import DigitsMLP, load_digits_tensors
from lightning_hydro.scaling import Surrogate, coord_check, plot_coord_checks
from lightning_hydro.scaling.coord_check import activation_sizes

from .stacking import StackedTrials

WIDTHS = [64, 128, 256, 512, 1024]
HIDDEN = ["body.0", "body.1", "body.2", "body.3"]  # the two hidden layers, before and after ReLU


@pytest.fixture(scope="module")
def batches():
    train, _ = load_digits_tensors()
    generator = torch.Generator().manual_seed(0)
    x, y = train.tensors
    return [(x[i], y[i]) for i in (torch.randperm(len(x), generator=generator)[:64] for _ in range(3))]


def mup(width: int) -> DigitsMLP:
    torch.manual_seed(0)
    s = Surrogate(DigitsMLP, width="hidden_dim")
    return s.build(hidden_dim=WIDTHS[-1], ratio=WIDTHS[-1] // width, optimizer="adam", lr=1e-3)


def standard(width: int) -> DigitsMLP:
    torch.manual_seed(0)
    return DigitsMLP(hidden_dim=width, optimizer="adam", lr=1e-3)


@pytest.fixture(scope="module")
def checks(batches):
    return {
        "muP": coord_check(mup, WIDTHS, batches, steps=3),
        "standard": coord_check(standard, WIDTHS, batches, steps=3),
    }


def test_mup_activations_stay_within_2x_across_widths(checks):
    for layer in [*HIDDEN, "head"]:
        assert checks["muP"].spread(layer, step=3) < 2.0, layer


def test_standard_parametrization_activations_grow_with_width(checks):
    assert checks["standard"].growth("body.2", step=3) > 1.3  # the width-fan-in hidden layer
    assert checks["standard"].growth("head", step=3) > 2.0  # the logits
    assert checks["standard"].growth("head", step=3) > 1.5 * checks["muP"].growth("head", step=3)


def test_at_initialisation_both_agree_on_hidden_layers(checks):
    for layer in HIDDEN:
        assert checks["muP"].spread(layer, step=0) < 1.5
        assert checks["standard"].spread(layer, step=0) < 1.5


def test_stacked_trials_are_measured_one_by_one(batches):
    lrs = [3e-4, 1e-3]

    def trials(width: int) -> list[DigitsMLP]:
        s = Surrogate(DigitsMLP, width="hidden_dim")
        built = []
        for lr in lrs:
            torch.manual_seed(0)
            built.append(s.build(hidden_dim=512, ratio=512 // width, optimizer="adam", lr=lr))
        return built

    def fused(models):
        return StackedTrials(models, lambda out, batch: F.cross_entropy(out, batch[1]))

    check = coord_check(trials, [64, 128, 512], batches, steps=3, update=fused)
    assert {r.trial for r in check.records} == {0, 1}
    for layer in HIDDEN:
        assert check.spread(layer, step=3) < 2.0
    separate = coord_check(lambda w: trials(w)[1], [64], batches, steps=3)
    fused_trial = [r for r in check.records if r.trial == 1 and r.width == 64 and r.step == 3]
    expected = {r.layer: r.size for r in separate.records if r.step == 3}
    assert {r.layer: r.size for r in fused_trial} == pytest.approx(expected, rel=1e-4)


def test_activation_sizes_measure_every_submodule():
    model = DigitsMLP(hidden_dim=8)
    sizes = activation_sizes(model, torch.ones(2, 64))
    assert list(sizes) == ["body.0", "body.1", "body.2", "body.3", "body", "head"]
    assert not model._forward_hooks  # hooks removed
    assert not model.head._forward_hooks


def test_plot_writes_one_row_per_check(checks, tmp_path):
    path = plot_coord_checks(checks, tmp_path / "coord.png", layers=HIDDEN)
    assert path.stat().st_size > 10_000
    assert checks["muP"].plot(tmp_path / "one.png").exists()


def test_summaries_and_errors(checks, batches):
    check = checks["muP"]
    assert check.widths() == WIDTHS
    assert check.steps() == [0, 1, 2, 3]
    assert check.layers()[:2] == ["body.0", "body.1"]
    with pytest.raises(KeyError, match=r"no records for layer 'nope' at step 3; layers: \['body.0'"):
        check.sizes("nope", 3)
    with pytest.raises(ValueError, match=r"needs at least one width and one batch and steps >= 0, got 0 widths"):
        coord_check(mup, [], batches)
    with pytest.raises(ValueError, match=r"got 1 widths, 1 batches and steps=-1"):
        coord_check(mup, [64], batches[:1], steps=-1)


def test_models_without_optimizer_need_an_update():
    class NoOptimizer(DigitsMLP):
        def configure_optimizers(self):
            return None

    with pytest.raises(ValueError, match=r"NoOptimizer.configure_optimizers\(\) returned no optimizer"):
        coord_check(lambda w: NoOptimizer(hidden_dim=w), [8], [(torch.ones(2, 64), torch.zeros(2).long())])
