import pytest
from omegaconf import OmegaConf

from lightning_hydro.sweeper.job.fit_from_config import apply_overrides, fit_from_config

CFG = {
    "seed": 1,
    "model": {"_target_": "lightning_hydro.demos.DigitsMLP", "hidden_dim": 8, "lr": 0.1},
    "data": {"_target_": "lightning_hydro.demos.DigitsDataModule", "batch_size": 32},
    "trainer": {
        "max_epochs": 1,
        "limit_train_batches": 2,
        "limit_val_batches": 1,
        "enable_progress_bar": False,
    },
}


def test_a_plain_run_outside_hydra_trains_trial_zero_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LIGHTNING_HYDRO_GROUP", raising=False)
    results = fit_from_config(OmegaConf.create(CFG))
    assert list(results) == [0]
    assert results[0]["status"] == "completed"
    assert (tmp_path / "trial_0000" / "checkpoints" / "last.ckpt").is_file()
    assert not (tmp_path / "group_result.json").exists()


def test_apply_overrides_makes_a_trial_config_and_leaves_the_original():
    cfg = OmegaConf.create(CFG)
    trial = apply_overrides(cfg, ["model.lr=0.5", "+model.dropout=0.1", "model.optimizer='adam'"])
    assert (trial.model.lr, trial.model.dropout, trial.model.optimizer) == (0.5, 0.1, "adam")
    assert cfg.model.lr == 0.1
    with pytest.raises(
        ValueError, match=r"apply_overrides: a trial override needs a single value, got 'model.lr=0.1,0.2'"
    ):
        apply_overrides(cfg, ["model.lr=0.1,0.2"])


@pytest.mark.parametrize(
    ("drop", "match"),
    [
        (
            "model",
            (
                r"the config needs a 'model' section with a _target_ \(your LightningModule class.*"
                r"got None\. Fix: add 'model: \{_target_: \.\.\.\}'"
            ),
        ),
        ("data", r"the config needs a 'data' section with a _target_ \(your LightningDataModule"),
    ],
)
def test_missing_sections(tmp_path, monkeypatch, drop, match):
    monkeypatch.chdir(tmp_path)
    cfg = OmegaConf.create({k: v for k, v in CFG.items() if k != drop})
    with pytest.raises(ValueError, match=match):
        fit_from_config(cfg)


@pytest.mark.parametrize("key", ["trainer", "callbacks", "logger"])  # `fused` is read in a sweep job only
def test_a_value_where_a_section_of_settings_belongs_is_refused(tmp_path, monkeypatch, key):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=rf"^fit_from_config: the config's '{key}' must be a section .* got 3\. Fix"):
        fit_from_config(OmegaConf.create({**CFG, key: 3}))


def test_a_group_spec_that_is_missing(tmp_path, monkeypatch):
    from lightning_hydro.sweeper.group_spec import read_group_spec

    monkeypatch.setenv("LIGHTNING_HYDRO_GROUP", "group_0042")
    with pytest.raises(
        FileNotFoundError,
        match=r"LIGHTNING_HYDRO_GROUP=group_0042 but .*group_0042.json does not exist\. "
        r"The sweep directory must be shared",
    ):
        read_group_spec(tmp_path)


def test_lightning_hydra_template_conventions_are_accepted(tmp_path, monkeypatch):
    """trainer._target_, an interpolated default_root_dir, seed: null, and callbacks/logger dicts of nodes."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LIGHTNING_HYDRO_GROUP", raising=False)
    cfg = OmegaConf.create(
        {
            **CFG,
            "seed": None,
            "paths": {"output_dir": str(tmp_path / "out")},
            "tags": ["dev"],
            "extras": {"print_config": False},
            "trainer": {
                **CFG["trainer"],
                "_target_": "lightning.pytorch.trainer.Trainer",
                "default_root_dir": "${paths.output_dir}",
            },
            "callbacks": {
                "lr_monitor": {"_target_": "lightning.pytorch.callbacks.LearningRateMonitor"},
                "unused": None,
            },
            "logger": {
                "csv": {
                    "_target_": "lightning.pytorch.loggers.csv_logs.CSVLogger",
                    "save_dir": "${paths.output_dir}",
                    "name": "csv/",
                }
            },
        }
    )
    results = fit_from_config(cfg)
    assert results[0]["status"] == "completed"
    run_dir = tmp_path / "out" / "trial_0000"  # under the interpolated default_root_dir
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert list((tmp_path / "out" / "csv").glob("version_*/metrics.csv"))  # the user's own logger logged


def test_a_trainer_target_that_is_not_a_trainer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = OmegaConf.create({**CFG, "trainer": {**CFG["trainer"], "_target_": "torch.nn.Linear"}})
    with pytest.raises(ValueError, match=r"trainer._target_='torch.nn.Linear' is not a lightning.Trainer"):
        fit_from_config(cfg)


def test_a_sweep_with_seed_null_gives_each_trial_a_seed_of_its_own_in_the_results(tmp_path):
    from ..conftest import TINY, read_results, run_sweep

    run_sweep(tmp_path, [*TINY, "hydra.sweeper.n_trials=2", "hydra.sweeper.fusion_limit=2", "seed=null"])
    seeds = [t["seed"] for t in read_results(tmp_path)["trials"]]
    assert all(isinstance(s, int) for s in seeds)
    assert len(set(seeds)) == 2
