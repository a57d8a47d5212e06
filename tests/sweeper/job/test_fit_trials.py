import json
import logging
from types import SimpleNamespace

import pytest
from lightning.pytorch.callbacks import EarlyStopping

from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from lightning_hydro.sweeper.group_spec import EarlyStoppingSpec
from lightning_hydro.sweeper.job.fit_trials import FusedSettings, fit_trials, trial_dir
from lightning_hydro.sweeper.job.trainer_factory import ConfigTrainerFactory

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
        assert result["backend"] == ""  # an unfused run


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
    with pytest.raises(ValueError, match=r"early stopping 'asha' decides between the trials of a fused group"):
        fit(tmp_path, {0: 0.1}, early_stopping=EarlyStoppingSpec(name="asha"))
    with pytest.raises(ValueError, match="fit_trials: slots must be >= 1, got 0"):
        fit_trials(builder({0: 0.1}), [0], slots=0, datamodule=None, trainer_factory=None, workdir=tmp_path)  # type: ignore[arg-type]


def test_a_fused_group_with_asha_refills_freed_slots_from_its_pending_trials(tmp_path):
    lrs = {10: 0.001, 11: 0.3, 12: 0.002, 13: 0.2, 14: 0.25, 15: 0.001}
    spec = EarlyStoppingSpec(name="asha", metric="val_acc", mode="max", reduction_factor=3, grace_period=1, max_t=3)
    results = fit_trials(
        builder(lrs),
        list(lrs),
        slots=3,
        datamodule=DigitsDataModule(batch_size=32),
        trainer_factory=ConfigTrainerFactory({**TRAINER, "max_epochs": 3}),
        workdir=tmp_path,
        early_stopping=spec,
        fused=FusedSettings(backend="vmap"),
    )
    assert sorted(results) == list(lrs)  # the sweep's ids are kept, also for refilled trials
    statuses = {tid: r["status"] for tid, r in results.items()}
    assert set(statuses.values()) <= {"completed", "stopped"}
    assert "stopped" in statuses.values()  # ASHA stopped some trials, whose slots the pending ones took
    assert sum(r["budget"] for r in results.values()) < 3 * len(lrs)  # less than every trial to max_t
    assert all(r["budget"] >= 1 for r in results.values())  # every pending trial got a slot
    assert {r["backend"] for r in results.values()} == {"vmap"}  # refilled trials too


def test_successive_halving_trains_the_group_in_rounds_of_slots(tmp_path):
    lrs = {0: 0.001, 1: 0.3, 2: 0.002, 3: 0.2}
    spec = EarlyStoppingSpec(name="successive_halving", metric="val_acc", mode="max", reduction_factor=2)
    results = fit_trials(
        builder(lrs),
        list(lrs),
        slots=2,
        datamodule=DigitsDataModule(batch_size=32),
        trainer_factory=ConfigTrainerFactory({**TRAINER, "max_epochs": 2}),
        workdir=tmp_path,
        early_stopping=spec,
        fused=FusedSettings(backend="vmap"),
    )
    assert (tmp_path / "fused_0").is_dir()
    assert (tmp_path / "fused_1").is_dir()
    assert sorted(r["status"] for r in results.values()) == ["completed", "completed", "stopped", "stopped"]


def test_a_deterministic_auto_group_records_the_backend_it_chose_without_timing(tmp_path, monkeypatch):
    from lightning_hydro.backends import auto

    def timed(*args, **kwargs):
        raise AssertionError("the fused group timed its backends")

    monkeypatch.setattr(auto, "time", SimpleNamespace(perf_counter=timed))
    lrs = {0: 0.1, 1: 0.2}
    results = fit(tmp_path, lrs, fused=FusedSettings(backend="auto", deterministic=True))
    assert {r["backend"] for r in results.values()} == {"hfta"}  # the first of hfta, vmap, loop that runs
    assert json.loads((tmp_path / "fused_0" / "group_fit.json").read_text())["0"]["backend"] == "hfta"


def test_fused_settings_carry_compile_to_the_group():
    assert FusedSettings(compile="reduce-overhead").compile == "reduce-overhead"
    assert FusedSettings().compile is False


def test_a_group_of_different_widths_fuses_padded_with_asha_and_refills(tmp_path):
    widths = {20: 8, 21: 32, 22: 16, 23: 24, 24: 40}
    spec = EarlyStoppingSpec(name="asha", metric="val_acc", mode="max", reduction_factor=3, grace_period=1, max_t=3)
    results = fit_trials(
        lambda tid: DigitsMLP(hidden_dim=widths[tid], lr=0.05),
        list(widths),
        slots=3,
        datamodule=DigitsDataModule(batch_size=32),
        trainer_factory=ConfigTrainerFactory({**TRAINER, "max_epochs": 3}),
        workdir=tmp_path,
        early_stopping=spec,
        fused=FusedSettings(backend="vmap", pad_widths=True),
    )
    assert sorted(results) == list(widths)
    assert {r["backend"] for r in results.values()} == {"vmap"}
    assert all(r["budget"] >= 1 for r in results.values())  # refills of other widths took freed slots


def test_without_pad_widths_a_group_of_different_widths_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"cannot be fused .* differ only in sizes .* pad_widths=True fuses them"):
        fit_trials(
            lambda tid: DigitsMLP(hidden_dim=8 * (tid + 1), lr=0.05),
            [0, 1],
            slots=2,
            datamodule=DigitsDataModule(batch_size=32),
            trainer_factory=ConfigTrainerFactory(TRAINER),
            workdir=tmp_path,
            fused=FusedSettings(backend="vmap"),
        )
