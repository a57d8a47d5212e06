"""The job's rewritten model node, the fused group it builds, and the launch-time fusion report (units)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lightning_hydro.sweeper.group_spec import EarlyStoppingSpec, GroupSpec, TrialSpec, read_group_result, trial_seed
from lightning_hydro.sweeper.job.group_model import (
    GROUP_MODEL_TARGET,
    fused_group_model,
    restore_model_node,
    rewrite_model_node,
)
from lightning_hydro.sweeper.job.sweep_group_module import SweepGroupModule
from lightning_hydro.sweeper.planning.fusion_report import nothing_fuses_message
from lightning_hydro.sweeper.planning.trial_groups import TrialGroup
from tests.helpers import fit_digits, make_trainer


def test_the_rewritten_node_keeps_every_key_and_interpolation_and_restores():
    cfg = OmegaConf.create({"width": 8, "model": {"_target_": "my.Module", "net": {"size": "${width}"}}})
    rewrite_model_node(cfg)
    rewrite_model_node(cfg)  # idempotent
    assert cfg.model._target_ == GROUP_MODEL_TARGET
    assert cfg.model._recursive_ is False
    assert cfg.model.net.size == 8
    restore_model_node(cfg)
    assert OmegaConf.to_container(cfg.model) == {"_target_": "my.Module", "net": {"size": "${width}"}}


@pytest.mark.parametrize("model", [None, {"lr": 0.1}])
def test_a_config_without_an_instantiable_model_node(model):
    cfg = OmegaConf.create({"model": model})
    with pytest.raises(ValueError, match=r"the config's 'model' node must be an instantiable LightningModule config"):
        rewrite_model_node(cfg)


def test_the_group_target_is_not_for_users():
    with pytest.raises(ValueError, match=r"fused_group_model: the model node has no _trial_target_"):
        fused_group_model(lr=0.1)


def test_outside_a_sweep_the_rewritten_node_builds_the_users_module(monkeypatch):
    monkeypatch.delenv("LIGHTNING_HYDRO_GROUP", raising=False)
    module = fused_group_model(_trial_target_="lightning_hydro.demos.DigitsMLP", hidden_dim=8)
    assert type(module).__name__ == "DigitsMLP"


def test_a_group_with_waiting_trials_needs_a_refilling_scheduler(tmp_path: Path):
    spec = GroupSpec("group_0000", "search", 1, (TrialSpec(0), TrialSpec(1)), EarlyStoppingSpec("successive_halving"))
    with pytest.raises(ValueError, match=r"group group_0000 has 2 trials for 1 slots.*refill=false"):
        SweepGroupModule.for_group(spec, lambda tid: None, job_dir=tmp_path)  # type: ignore[arg-type,return-value]


def test_trial_seeds():
    assert trial_seed(5, 0, 1) == trial_seed(5, 3, 2) == 5
    seeds = {trial_seed(None, 0, t) for t in range(100)}
    assert len(seeds) == 100
    assert trial_seed(None, 1, 0) != trial_seed(None, 0, 0)


def test_the_fusion_report_is_silent_when_a_group_fuses():
    groups = [
        TrialGroup("g0", "search", (0, 1), 2, (("data.batch_size", "32"),)),
        TrialGroup("g1", "search", (2,), 1, (("data.batch_size", "64"),)),
    ]
    assert nothing_fuses_message(groups, ["data.batch_size"], ["data.batch_size"]) is None
    assert nothing_fuses_message(groups[1:], ["data.batch_size"], ["data.batch_size"]) is None  # one trial


def test_the_group_module_takes_the_configs_fused_settings(tmp_path: Path):
    from lightning_hydro.demos import DigitsMLP

    fused = {"backend": "vmap", "optimizer_path": "universal", "deterministic": True}
    spec = GroupSpec("group_0000", "search", 2, (TrialSpec(0), TrialSpec(1)), fused=fused)
    module = SweepGroupModule.for_group(spec, lambda tid: DigitsMLP(hidden_dim=8), job_dir=tmp_path)
    assert module.backend == "vmap"
    assert module.deterministic is True


def test_the_group_module_compiles_when_the_spec_says_so(tmp_path: Path):
    from lightning_hydro.demos import DigitsMLP

    fused = {"backend": "vmap", "compile": True}
    spec = GroupSpec("group_0000", "search", 2, (TrialSpec(0), TrialSpec(1)), fused=fused)
    module = SweepGroupModule.for_group(spec, lambda tid: DigitsMLP(hidden_dim=8), job_dir=tmp_path)
    assert module._policy.compile is True
    assert module._policy.backend is not None
    assert module._policy.backend.compile is True  # type: ignore[attr-defined]


def test_the_group_module_pads_widths_when_the_config_says_so(tmp_path: Path):
    from lightning_hydro.demos import DigitsMLP

    spec = GroupSpec("group_0000", "search", 2, (TrialSpec(0), TrialSpec(1)), fused={"pad_widths": True})
    module = SweepGroupModule.for_group(spec, lambda tid: DigitsMLP(hidden_dim=8 * (tid + 1)), job_dir=tmp_path)
    assert module.unfuse(1).hparams["hidden_dim"] == 16
    assert module.stacked.get_parameter("head__weight").shape[-1] == 16
    plain = GroupSpec("group_0001", "search", 2, (TrialSpec(0), TrialSpec(1)))
    with pytest.raises(ValueError, match=r"Trial 1 cannot be fused with trial 0"):
        SweepGroupModule.for_group(plain, lambda tid: DigitsMLP(hidden_dim=8 * (tid + 1)), job_dir=tmp_path)


def test_a_trial_whose_module_raises_fails_alone_and_its_group_mates_train(tmp_path: Path):
    # before: the first module that raised ended the group job (every trial "failed", no error recorded)
    from lightning_hydro.demos import DigitsMLP

    def build(tid: int) -> DigitsMLP:
        if tid == 1:
            raise ValueError("DigitsMLP: optimizer must be 'sgd', 'adam' or 'adamw', got 'bogus'.")
        return DigitsMLP(hidden_dim=8)

    spec = GroupSpec("group_0000", "search", 3, (TrialSpec(0), TrialSpec(1), TrialSpec(2)))
    module = SweepGroupModule.for_group(spec, build, job_dir=tmp_path)
    assert module.trial_ids == [0, 2]
    fit_digits(make_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1), module)
    trials = read_group_result(tmp_path)["trials"]
    assert {tid: t["status"] for tid, t in trials.items()} == {"0": "completed", "1": "failed", "2": "completed"}
    assert trials["1"]["error"] == "ValueError: DigitsMLP: optimizer must be 'sgd', 'adam' or 'adamw', got 'bogus'."


def test_a_group_none_of_whose_trials_builds_says_why(tmp_path: Path):
    spec = GroupSpec("group_0000", "search", 2, (TrialSpec(0), TrialSpec(1)))
    with pytest.raises(RuntimeError, match=r"no trial of group group_0000 could build its module \(trial 0: KeyError"):
        SweepGroupModule.for_group(spec, lambda tid: {}["missing"], job_dir=tmp_path)  # type: ignore[return-value]
