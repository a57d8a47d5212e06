"""The backend a fused group trains on is recorded (results, checkpoints) and can be chosen without timing."""

import types

import pytest
import torch
from torch import nn

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends import auto
from lightning_hydro.backends.auto import AutoChoice, choose_backend
from lightning_hydro.backends.errors import FusionError
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.stacking.stacked_state import StackedState
from tests.helpers import fit_digits, make_trainer, max_state_difference, seeded, train_fused, train_separately


def mlps(n=3):
    return seeded(lambda: DigitsMLP(hidden_dim=8, lr=0.1), range(n))


def no_clock(monkeypatch):
    """Make any timing inside auto's chooser fail the test."""

    def perf_counter():
        raise AssertionError("backend='auto' timed a candidate")

    monkeypatch.setattr(auto, "time", types.SimpleNamespace(perf_counter=perf_counter))


@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop"])
def test_a_pinned_backend_is_in_every_trials_results_from_the_start(backend):
    fused = FusedLightningModule(mlps(), backend=backend, summary=False)
    assert {r["backend"] for r in fused.results.values()} == {backend}
    fit_digits(make_trainer(max_steps=2), fused)
    assert {r["backend"] for r in fused.results.values()} == {backend}


def test_autos_choice_is_recorded_for_every_trial_and_a_newcomer(monkeypatch):
    monkeypatch.setattr(
        "lightning_hydro.fused.module.choose_backend",
        lambda group, candidates, run_step, **kwargs: AutoChoice(dict(candidates)["vmap"]()),
    )
    fused = FusedLightningModule(mlps(), backend="auto", max_slots=4, summary=False)
    assert {r["backend"] for r in fused.results.values()} == {""}  # not chosen before the first batch
    fit_digits(make_trainer(max_steps=2), fused)
    fused.add_trial(DigitsMLP(hidden_dim=8))
    assert [r["backend"] for r in fused.results.values()] == ["vmap"] * 4


def test_deterministic_auto_takes_the_first_backend_that_runs_without_timing(monkeypatch):
    no_clock(monkeypatch)
    fused = FusedLightningModule(mlps(), backend="auto", deterministic=True, summary=False)
    fit_digits(make_trainer(max_steps=3), fused)
    assert fused.backend == "hfta"
    assert "(deterministic) chose 'hfta'" in fused.backend_report
    assert {r["backend"] for r in fused.results.values()} == {"hfta"}


def test_deterministic_auto_runs_are_bitwise_identical(monkeypatch):
    no_clock(monkeypatch)
    runs = []
    for _ in range(2):
        fused = FusedLightningModule(mlps(), backend="auto", deterministic=True, summary=False)
        fit_digits(make_trainer(max_steps=5), fused)
        runs.append([p.detach().clone() for p in fused.stacked.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_deterministic_must_be_a_bool():
    with pytest.raises(TypeError, match="deterministic must be True or False, got 'false'"):
        FusedLightningModule(mlps(), deterministic="false")  # type: ignore[arg-type]


def test_a_resumed_run_reuses_the_recorded_backend_without_choosing_again(tmp_path, monkeypatch):
    monkeypatch.setattr(
        "lightning_hydro.fused.module.choose_backend",
        lambda group, candidates, run_step, **kwargs: AutoChoice(dict(candidates)["vmap"]()),
    )
    fused = FusedLightningModule(mlps(), backend="auto", summary=False)
    trainer = make_trainer(max_steps=2)
    fit_digits(trainer, fused)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")

    def refuse(*args, **kwargs):
        raise AssertionError("the resumed run chose its backend again")

    monkeypatch.setattr("lightning_hydro.fused.module.choose_backend", refuse)
    resumed = FusedLightningModule(mlps(), backend="auto", summary=False)
    fit_digits(make_trainer(max_steps=4), resumed, ckpt_path=tmp_path / "mid.ckpt")
    assert resumed.backend == "vmap"
    assert {r["backend"] for r in resumed.results.values()} == {"vmap"}


class _Fake:
    def __init__(self, name):
        self.name = name


def test_untimed_choice_skips_candidates_that_cannot_run_and_leaves_the_cache_alone(monkeypatch):
    no_clock(monkeypatch)
    group = StackedState(nn.Module(), mlps(2), [0, 1])
    ran = []

    def run_step(backend):
        ran.append(backend.name)
        if backend.name == "hfta":
            raise FusionError("hfta cannot convert this module")

    candidates = [(name, lambda name=name: _Fake(name)) for name in ("hfta", "vmap", "loop")]
    choice = choose_backend(group, candidates, run_step, timed=False)
    assert (choice.backend.name, ran) == ("vmap", ["hfta", "vmap"])  # loop is never run
    assert choice.skipped == {"hfta": "hfta cannot convert this module"}
    assert "(deterministic) chose 'vmap'" in choice.describe()
    assert "hfta skipped: hfta cannot convert this module" in choice.describe()
    assert auto._CACHE == {}


def fake_step_times(monkeypatch, seconds, refuse=()):
    """A run_step for auto's chooser that takes ``seconds[name]`` on a fake clock (a name in ``refuse`` refuses)."""
    clock = {"now": 0.0}
    monkeypatch.setattr(auto, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))
    auto.clear_backend_cache()

    def run_step(backend):
        if backend.name in refuse:
            raise FusionError(f"{backend.name} cannot run this model")
        clock["now"] += seconds[backend.name]

    return run_step


@pytest.mark.parametrize("compile", [True, "reduce-overhead"])
def test_auto_under_compile_keeps_a_fused_backend_where_the_eager_loop_was_faster(monkeypatch, compile):
    # compile applies to hfta and vmap: the loop, timed eagerly 3x faster, would never compile
    run_step = fake_step_times(monkeypatch, {"hfta": 0.030, "vmap": 0.020, "loop": 0.010})
    fused = FusedLightningModule(mlps(2), backend="auto", compile=compile, summary=False)
    fused._policy.for_training(run_step, choose_backend, "DigitsMLP")
    backend = fused._policy.backend  # what the steps after the timed batch run
    assert (backend.name, backend.compile) == ("vmap", compile)
    assert fused.backend_report == (
        "FusedLightningModule: backend='auto' chose 'vmap' (forward+backward per step on the first batch: loop "
        f"10.00 ms, vmap 20.00 ms, hfta 30.00 ms; compile={compile!r} applies to hfta and vmap, timed here "
        "eagerly: auto keeps the first of hfta, vmap whose time is within 10% of the fastest of them, so that "
        "timing noise does not flip the choice); fused, the 2 trials step 0.5x as fast as one after another; "
        "this machine's 2 cores could run 2 of them side by side, one thread each: separate concurrent runs "
        "(e.g. hydra/launcher=joblib with n_jobs=2) would likely be faster."
    )
    auto.clear_backend_cache()


def test_auto_without_compile_still_takes_the_faster_loop(monkeypatch):
    run_step = fake_step_times(monkeypatch, {"hfta": 0.030, "vmap": 0.020, "loop": 0.010})
    fused = FusedLightningModule(mlps(2), backend="auto", summary=False)
    assert fused._policy.for_training(run_step, choose_backend, "DigitsMLP").name == "loop"
    auto.clear_backend_cache()


def test_auto_under_compile_runs_the_loop_only_where_no_fused_backend_runs(monkeypatch):
    run_step = fake_step_times(monkeypatch, {"hfta": 0.030, "vmap": 0.020, "loop": 0.010}, refuse=("hfta", "vmap"))
    fused = FusedLightningModule(mlps(2), backend="auto", compile=True, summary=False)
    assert fused._policy.for_training(run_step, choose_backend, "DigitsMLP").name == "loop"
    assert "hfta skipped: hfta cannot run this model; vmap skipped: vmap cannot run this model" in fused.backend_report
    auto.clear_backend_cache()


@pytest.mark.parametrize(("refuse", "chosen"), [((), "hfta"), (("hfta",), "vmap"), (("hfta", "vmap"), "loop")])
def test_deterministic_auto_under_compile_takes_the_first_fused_backend_that_runs(monkeypatch, refuse, chosen):
    no_clock(monkeypatch)
    ran = []

    def run_step(backend):
        ran.append(backend.name)
        if backend.name in refuse:
            raise FusionError(f"{backend.name} cannot run this model")

    fused = FusedLightningModule(mlps(2), backend="auto", compile=True, deterministic=True, summary=False)
    fused._policy.for_training(run_step, choose_backend, "DigitsMLP")
    assert (fused._policy.backend.name, ran) == (chosen, [*refuse, chosen])  # nothing after the first that runs


class WeightPenalty(DigitsMLP):
    """A penalty weight the step reads from hparams: trials that differ in it cannot share one vmap/hfta step."""

    def __init__(self, penalty: float = 0.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y) + self.hparams.penalty * self.head.weight.square().sum()
        self.log("train_loss", loss)
        return loss


def penalised(*penalties):
    modules = []
    for seed, penalty in enumerate(penalties):
        torch.manual_seed(seed)
        modules.append(WeightPenalty(penalty, hidden_dim=8, lr=0.1))
    return modules


def test_a_cached_choice_that_a_new_group_refuses_falls_back_as_in_a_fresh_process():
    # a sweep fits several groups of one class in one process: the first group's trials agree (a fused backend),
    # the second's differ in a value the step reads, which the cached fused choice cannot run
    agreeing = FusedLightningModule(penalised(0.01, 0.01, 0.01), backend="auto", summary=False)
    fit_digits(make_trainer(max_steps=2), agreeing)
    assert agreeing.backend in ("hfta", "vmap")
    differing = penalised(0.0, 0.01, 0.1)
    fused = train_fused(differing, fit_digits, fused_kwargs=dict(backend="auto"), max_steps=3)
    assert fused.backend == "loop"
    assert f"{agreeing.backend} skipped: backend='{agreeing.backend}' cannot fuse these" in fused.backend_report
    for i, alone in enumerate(train_separately(differing, fit_digits, max_steps=3)):
        assert max_state_difference(fused.unfuse(i), alone) == 0.0
    # the group-specific refusal left the cached choice for groups whose trials agree
    again = FusedLightningModule(penalised(0.1, 0.1, 0.1), backend="auto", summary=False)
    fit_digits(make_trainer(max_steps=1), again)
    assert again.backend == agreeing.backend
    assert "reused its earlier choice" in again.backend_report
