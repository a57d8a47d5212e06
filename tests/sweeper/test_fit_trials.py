import json
import logging

import pytest
from lightning.pytorch.callbacks import EarlyStopping

from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from lightning_hydro.sweeper.fit_trials import fit_trials, trial_dir
from lightning_hydro.sweeper.group_spec import EarlyStoppingSpec
from lightning_hydro.sweeper.trainer_factory import ConfigTrainerFactory

TRAINER = {
    "max_epochs": 2,
    "limit_train_batches": 2,
    "limit_val_batches": 1,
    "log_every_n_steps": 1,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


def builder(lrs, built=None):
    def build(trial_id):
        if built is not None:
            built.append(trial_id)
        return DigitsMLP(hidden_dim=8, lr=lrs[trial_id])

    return build


def fit(tmp_path, lrs, trainer=TRAINER, built=None, **kwargs):
    return fit_trials(
        builder(lrs, built),
        list(lrs),
        slots=len(lrs),
        datamodule=DigitsDataModule(batch_size=32),
        trainer_factory=ConfigTrainerFactory(trainer, kwargs.pop("callbacks", None)),
        workdir=tmp_path,
        **kwargs,
    )


def test_trials_train_one_after_another_in_their_own_directories(tmp_path):
    results = fit(tmp_path, {3: 0.1, 7: 0.2})
    assert list(results) == [3, 7]
    for tid, result in results.items():
        assert result["status"] == "completed"
        assert result["budget"] == 2
        assert set(result["metrics"]) == {"train_loss", "val_loss", "val_acc"}
        assert [row["epoch"] for row in result["history"]] == [0, 1]
        assert result["history"][-1]["val_acc"] == result["metrics"]["val_acc"]
        root = trial_dir(tmp_path, tid)
        assert (root / "checkpoints" / "last.ckpt").is_file()
        assert (root / "logs" / "version_0" / "metrics.csv").is_file()
        assert json.loads((root / "trial_result.json").read_text()) == result


def test_a_rerun_skips_finished_trials_and_resumes_an_interrupted_one(tmp_path, caplog):
    fit(tmp_path, {0: 0.1, 1: 0.2}, trainer={**TRAINER, "max_epochs": 1})
    # Trial 1 "crashed" after its first epoch's checkpoint, before it could record its result.
    (trial_dir(tmp_path, 1) / "trial_result.json").unlink()
    (trial_dir(tmp_path, 0) / "trial_result.json").write_text(
        json.dumps({"status": "completed", "budget": 2, "metrics": {"val_acc": 0.5}, "history": []})
    )
    built = []
    with caplog.at_level(logging.INFO, logger="lightning_hydro"):
        results = fit(tmp_path, {0: 0.1, 1: 0.2}, built=built)
    assert built == [1]
    assert results[0]["metrics"] == {"val_acc": 0.5}
    assert f"trial 1: resuming from {trial_dir(tmp_path, 1) / 'checkpoints' / 'last.ckpt'}" in caplog.text
    assert results[1]["budget"] == 2
    assert [row["epoch"] for row in results[1]["history"]] == [0, 1]  # epoch 0 came back from the checkpoint
    # Each attempt logs to a new version: the first attempt's metrics.csv is kept.
    assert (trial_dir(tmp_path, 1) / "logs" / "version_0" / "metrics.csv").is_file()
    assert (trial_dir(tmp_path, 1) / "logs" / "version_1" / "metrics.csv").is_file()


def test_statuses_diverged_and_stopped(tmp_path):
    # lr=inf turns the weights non-finite after the first step: the guard stops the trial in epoch 0.
    trainer = {**TRAINER, "max_epochs": 3, "limit_train_batches": 4}
    diverged = fit(tmp_path / "a", {0: float("inf")}, trainer=trainer)[0]
    assert diverged["status"] == "diverged"
    assert diverged["budget"] == 1
    stop = {
        "stop": {
            "_target_": "lightning.pytorch.callbacks.EarlyStopping",
            "monitor": "val_acc",
            "mode": "max",
            "patience": 0,
            "min_delta": 1.0,
        }
    }
    stopped = fit(tmp_path / "b", {0: 0.1}, trainer={**TRAINER, "max_epochs": 4}, callbacks=stop)[0]
    assert stopped["status"] == "stopped"
    assert stopped["budget"] == 2
    assert EarlyStopping  # the user's callbacks come from the config, instantiated per trial


def test_errors(tmp_path):
    with pytest.raises(
        NotImplementedError,
        match=r"early stopping 'asha' needs lightning_hydro's early-stopping callbacks.*"
        r"Fix: set hydra.sweeper.scheduler.name=none",
    ):
        fit(tmp_path, {0: 0.1}, early_stopping=EarlyStoppingSpec(name="asha"))
    with pytest.raises(ValueError, match="fit_trials: slots must be >= 1, got 0"):
        fit_trials(builder({0: 0.1}), [0], slots=0, datamodule=None, trainer_factory=None, workdir=tmp_path)  # type: ignore[arg-type]
