"""Faults in a run's state: a fit resumed from a checkpoint written mid-epoch, a trial whose module cannot be
built, corrupt sweep state files, a monitor that is never logged, a surrogate checkpoint from a user path.

SIGKILL of a whole sweep and of a fused fit, and processes sharing one rung store, are covered where those
features are tested: ``tests/sweeper/test_resume.py`` (sweeps killed at three moments, basic and joblib
launchers), ``tests/callbacks/test_resume.py`` (a fit killed between epochs) and
``tests/stopping/test_concurrent_processes.py`` (8 processes, one SQLite store).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from omegaconf import OmegaConf

from lightning_hydro import FusedLightningModule
from lightning_hydro.callbacks import ASHA
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from lightning_hydro.scaling import Surrogate
from lightning_hydro.sweeper.group_spec import GROUP_ENV, EarlyStoppingSpec, read_group_spec, spec_path
from lightning_hydro.sweeper.job.fit_trials import FusedSettings, fit_trials
from lightning_hydro.sweeper.job.trainer_factory import ConfigTrainerFactory
from lightning_hydro.sweeper.json_files import CorruptStateFile
from lightning_hydro.sweeper.planning.search_space import Configuration
from lightning_hydro.sweeper.planning.sweep_state import SweepState
from lightning_hydro.sweeper.planning.trial_groups import Trial
from tests.callbacks.trials import LEARNING_RATES, fit, fused, mlp, mlps
from tests.helpers import make_trainer
from tests.sweeper.conftest import TINY, read_results, run_sweep

pytestmark = pytest.mark.filterwarnings(
    "ignore:Checkpoint directory .* exists and is not empty",
    "ignore:You're resuming from a checkpoint that ended before the epoch ended",
)

BATCHES = 5  # training batches per epoch
EPOCHS = 4


class Interrupted(Exception):
    pass


class InterruptAtStep(Callback):
    """Ends the fit with an exception when the given optimizer step is about to be taken."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        if trainer.global_step == self.step:
            raise Interrupted


def fit_every_n_steps(
    module: L.LightningModule, callbacks: list[Callback], directory: Path, *, every: int, resume: bool = False
) -> L.Trainer:
    checkpoint = ModelCheckpoint(dirpath=directory, every_n_train_steps=every, save_last=True)
    return fit(
        module,
        [*callbacks, checkpoint],
        max_epochs=EPOCHS,
        enable_checkpointing=True,
        limit_train_batches=BATCHES,
        ckpt_path="last" if resume else None,
    )


def asha(**kwargs: Any) -> ASHA:
    return ASHA("val_loss", grace_period=1, reduction_factor=2, max_t=EPOCHS, **kwargs)


def counts(module: Any) -> dict[int, tuple[str, int, int]]:
    return {tid: (r["status"], r["epochs"], r["steps"]) for tid, r in module.results.items()}


def decisions(callback: ASHA) -> list[tuple[Any, ...]]:
    return sorted((o.trial_id, o.status, o.budget, o.rung) for o in callback.endings.values())


# every=3 and 4: checkpoints written mid-epoch (after steps 6 and 8, in epoch 1), resumed there
@pytest.mark.parametrize("every", [3, 4])
def test_a_fused_fit_resumed_from_a_mid_epoch_checkpoint_counts_and_decides_as_an_uninterrupted_one(every, tmp_path):
    def make() -> tuple[Any, ASHA]:
        return fused(LEARNING_RATES[:4]), asha(refill=mlps([0.2, 0.02, 0.002]))

    reference, reference_asha = make()
    fit_every_n_steps(reference, [reference_asha], tmp_path / "reference", every=every)

    first, first_asha = make()
    with pytest.raises(Interrupted):
        fit_every_n_steps(first, [first_asha, InterruptAtStep(2 * every + 1)], tmp_path / "run", every=every)
    resumed, resumed_asha = make()
    trainer = fit_every_n_steps(resumed, [resumed_asha], tmp_path / "run", every=every, resume=True)

    assert trainer.global_step == EPOCHS * BATCHES
    assert counts(resumed) == counts(reference)
    assert max(r["steps"] for r in reference.results.values()) == EPOCHS * BATCHES
    assert decisions(resumed_asha) == decisions(reference_asha)
    assert len(decisions(reference_asha)) == 7


def test_a_fused_fit_resumed_from_a_checkpoint_after_an_epochs_last_batch_counts_that_epoch(tmp_path):
    # Lightning resumes such a checkpoint in the next epoch, without the interrupted epoch's validation or
    # on_train_epoch_end, and without on_train_epoch_start.
    reference = fused(LEARNING_RATES[:2])
    fit_every_n_steps(reference, [], tmp_path / "reference", every=BATCHES)
    with pytest.raises(Interrupted):
        fit_every_n_steps(
            fused(LEARNING_RATES[:2]), [InterruptAtStep(2 * BATCHES + 1)], tmp_path / "run", every=BATCHES
        )
    resumed = fused(LEARNING_RATES[:2])
    fit_every_n_steps(resumed, [], tmp_path / "run", every=BATCHES, resume=True)

    assert counts(resumed) == counts(reference) == {0: ("completed", 4, 20), 1: ("completed", 4, 20)}
    assert [h["epoch"] for h in resumed.results[0]["history"]] == [0, 1, 2, 3]


def test_a_trial_that_diverges_in_the_batch_a_checkpoint_is_written_is_diverged_after_resume(tmp_path):
    # lr=inf: trial 1's weights are non-finite after its first step, so its second step (batch 1) diverges
    reference = fused([0.1, float("inf")])
    fit_every_n_steps(reference, [], tmp_path / "reference", every=2)
    with pytest.raises(Interrupted):
        fit_every_n_steps(fused([0.1, float("inf")]), [InterruptAtStep(3)], tmp_path / "run", every=2)
    resumed = fused([0.1, float("inf")])
    fit_every_n_steps(resumed, [], tmp_path / "run", every=2, resume=True)

    assert counts(reference)[1] == ("diverged", 0, 1)
    assert counts(resumed) == counts(reference)
    assert resumed.results[1]["reason"] == reference.results[1]["reason"]


@pytest.mark.parametrize("every", [3, 5])
def test_one_trial_resumed_from_a_mid_epoch_checkpoint_keeps_its_budget(every, tmp_path):
    storage = str(tmp_path / "rungs.db")
    reference = asha(storage=str(tmp_path / "reference.db"), trial_id="t")
    fit_every_n_steps(mlp(0.3), [reference], tmp_path / "reference", every=every)

    first = asha(storage=storage, trial_id="t")
    with pytest.raises(Interrupted):
        fit_every_n_steps(mlp(0.3), [first, InterruptAtStep(2 * every + 1)], tmp_path / "run", every=every)
    resumed = asha(storage=storage, trial_id="t")
    fit_every_n_steps(mlp(0.3), [resumed], tmp_path / "run", every=every, resume=True)

    assert (resumed.result["budget"], resumed.result["epochs"]) == (EPOCHS, EPOCHS)
    assert (resumed.status, resumed.result["steps"]) == (reference.status, reference.result["steps"])


# -- a trial whose module raises in __init__ fails alone ------------------------------------------------------------

TRAINER = {
    "max_epochs": 2,
    "limit_train_batches": 2,
    "limit_val_batches": 1,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}
BOGUS = "DigitsMLP: optimizer must be 'sgd', 'adam' or 'adamw', got 'bogus'."


def fit_group(tmp_path: Path, optimizers: dict[int, str], *, slots: int, stopping: str = "none") -> dict[int, Any]:
    def build(trial_id: int) -> L.LightningModule:
        return DigitsMLP(hidden_dim=8, lr=0.1 + 0.05 * trial_id, optimizer=optimizers[trial_id])  # type: ignore[arg-type]

    spec = EarlyStoppingSpec(name=stopping, metric="val_acc", mode="max", reduction_factor=2, max_t=2)
    return fit_trials(
        build,
        list(optimizers),
        slots=slots,
        datamodule=DigitsDataModule(batch_size=32),
        trainer_factory=ConfigTrainerFactory(TRAINER),
        workdir=tmp_path,
        early_stopping=spec,
        fused=FusedSettings(backend="vmap"),
    )


@pytest.mark.parametrize("stopping", ["none", "asha"])
def test_a_trial_whose_module_raises_fails_alone_and_its_group_trains(stopping, tmp_path):
    # with asha, trials 3 and 4 wait for a slot: trial 3 fails when drawn to refill one, mid-fit
    optimizers = {0: "sgd", 1: "bogus", 2: "adam", 3: "bogus", 4: "sgd"}
    results = fit_group(tmp_path, optimizers, slots=2 if stopping == "asha" else 5, stopping=stopping)

    assert sorted(results) == [0, 1, 2, 3, 4]
    for tid in (1, 3):
        assert results[tid] == {
            "status": "failed",
            "budget": 0,
            "metrics": {},
            "history": [],
            "error": f"ValueError: {BOGUS}",
        }
    for tid in (0, 2, 4):
        assert results[tid]["status"] in ("completed", "stopped"), tid
        assert results[tid]["budget"] >= 1, tid
        assert "val_acc" in results[tid]["metrics"], tid


def test_a_group_whose_every_trial_fails_to_build_reports_each(tmp_path):
    results = fit_group(tmp_path, {0: "bogus", 1: "bogus"}, slots=2)
    assert {tid: r["status"] for tid, r in results.items()} == {0: "failed", 1: "failed"}
    assert fit_group(tmp_path, {0: "bogus", 1: "bogus"}, slots=2) == results  # a rerun reads the round's result


def test_a_sweep_marks_only_the_trial_whose_module_raises_failed(tmp_path, hydra_restore_singletons):
    sweep_dir = tmp_path / "sweep"
    run_sweep(
        sweep_dir,
        [
            *TINY,
            f"hydra.sweep.dir={sweep_dir}",
            "hydra.sweeper.sampler=grid",
            "hydra.sweeper.params=null",
            "model.optimizer=sgd,bogus,adam",
        ],
    )
    trials = {t["params"]["model.optimizer"]: t for t in read_results(sweep_dir)["trials"]}
    assert (trials["bogus"]["status"], trials["bogus"]["error"]) == ("failed", f"ValueError: {BOGUS}")
    assert trials["sgd"]["group"] == trials["bogus"]["group"]  # one fused group
    assert trials["sgd"]["status"] == trials["adam"]["status"] == "completed"
    assert "val_loss" in trials["sgd"]["metrics"]


# -- corrupt state files on resume ---------------------------------------------------------------------------------


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("damage", ["truncated", "empty", "not_a_plan"])
def test_an_unreadable_plan_is_named_and_not_to_be_deleted(damage, tmp_path):
    SweepState(tmp_path, {"sampler": "grid"}).add([Trial(0, Configuration({"lr": 0.1}, {"lr": "0.1"}))], [])
    plan = tmp_path / "lightning_hydro" / "plan.json"
    if damage == "truncated":
        truncate(plan)
    else:
        plan.write_text("" if damage == "empty" else "[1, 2]")
    detail = {"truncated": "invalid JSON", "empty": "the file is empty", "not_a_plan": "not a plan"}[damage]
    with pytest.raises(CorruptStateFile, match=rf"{re.escape(str(plan))} is unreadable \({detail}.*do NOT delete it"):
        SweepState.open(tmp_path, {"sampler": "grid"})


def test_an_unreadable_group_spec_is_named_and_safe_to_delete(tmp_path, monkeypatch):
    path = spec_path(tmp_path, "group_0003")
    path.parent.mkdir(parents=True)
    path.write_text('{"group_id": "group_0003", "kind": "sea')
    monkeypatch.setenv(GROUP_ENV, "group_0003")
    with pytest.raises(CorruptStateFile, match=rf"{re.escape(str(path))} is unreadable .* it is safe to delete"):
        read_group_spec(tmp_path)


def fit_round(tmp_path: Path) -> dict[int, Any]:
    return fit_group(tmp_path, {0: "sgd", 1: "adam"}, slots=2)


def test_a_truncated_round_result_is_set_aside_and_the_round_resumed_from_its_checkpoint(tmp_path, caplog):
    first = fit_round(tmp_path)
    result = tmp_path / "fused_0" / "group_fit.json"
    truncate(result)
    with caplog.at_level(logging.WARNING, logger="lightning_hydro"):
        again = fit_round(tmp_path)
    assert f"{result} is unreadable (invalid JSON" in caplog.text
    assert (tmp_path / "fused_0" / "group_fit.json.corrupt").is_file()
    assert again == first  # resumed from the final checkpoint: no epoch trained again
    assert json.loads(result.read_text()) == {str(k): v for k, v in first.items()}


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_a_damaged_checkpoint_is_set_aside_and_the_round_trains_from_scratch(damage, tmp_path, caplog):
    first = fit_round(tmp_path)
    (tmp_path / "fused_0" / "group_fit.json").unlink()  # killed after the last checkpoint, before the result
    checkpoint = tmp_path / "fused_0" / "checkpoints" / "last.ckpt"
    truncate(checkpoint, keep=0.5 if damage == "truncated" else 0.0)
    with caplog.at_level(logging.WARNING, logger="lightning_hydro"):
        again = fit_round(tmp_path)
    assert f"{checkpoint} is unreadable (not a whole torch checkpoint" in caplog.text
    assert "the run starts from scratch" in caplog.text
    assert (checkpoint.parent / "last.ckpt.corrupt").is_file()
    assert {t: (r["status"], r["budget"]) for t, r in again.items()} == {0: ("completed", 2), 1: ("completed", 2)}
    rerun_log = (tmp_path / "fused_0" / "logs" / "version_1" / "metrics.csv").read_text().splitlines()
    epoch = rerun_log[0].split(",").index("epoch")
    assert {row.split(",")[epoch] for row in rerun_log[1:]} - {""} == {"0", "1"}  # both epochs trained again
    assert set(again[0]["metrics"]) == set(first[0]["metrics"])
    assert checkpoint.is_file()


def test_a_sweep_with_a_truncated_group_result_relaunches_the_group_without_retraining(
    tmp_path, hydra_restore_singletons
):
    sweep_dir = tmp_path / "sweep"
    args = [*TINY, f"hydra.sweep.dir={sweep_dir}", "hydra.sweeper.sampler=grid", "hydra.sweeper.params=null"]
    args.append("data.batch_size=32,64")  # two groups
    run_sweep(sweep_dir, args)
    before = read_results(sweep_dir)["trials"]
    truncate(sweep_dir / "group_0000" / "group_result.json")
    (sweep_dir / "results.json").unlink()

    run_sweep(sweep_dir, args)
    assert read_results(sweep_dir)["trials"] == before
    assert (sweep_dir / "group_0000" / "group_result.json.corrupt").is_file()
    assert not (sweep_dir / "group_0000" / "fused_0" / "logs" / "version_1").exists()  # not trained again


# -- a monitor that is never logged is reported before the first epoch ---------------------------------------------


def test_a_monitor_a_fused_group_never_logs_is_reported_after_the_sanity_check_and_one_batch():
    module = fused(LEARNING_RATES[:2])
    with pytest.raises(
        RuntimeError,
        match=r"ASHA\(monitor='val_los'\): the monitor is not logged by any trial of the fused module after the "
        r"sanity check and the first training batch; logged: 'train_loss', 'val_acc', 'val_loss'\.",
    ):
        fit(module, [ASHA("val_los", max_t=2)], max_epochs=2, num_sanity_val_steps=1)
    # raised at the first batch's end, before the module credits its step (it used to come after 3 steps)
    assert [r["steps"] for r in module.results.values()] == [0, 0]


def test_a_monitor_a_fused_group_never_logs_without_validation_is_reported_after_one_batch():
    module = fused(LEARNING_RATES[:2])
    with pytest.raises(RuntimeError, match=r"ASHA\(monitor='val_loss'\): .* after the sanity check and the first"):
        fit(module, [ASHA("val_loss", max_t=2)], max_epochs=2, limit_val_batches=0)
    assert [r["steps"] for r in module.results.values()] == [0, 0]


@pytest.mark.parametrize("monitor", ["val_acc", "train_loss"])
def test_a_monitor_logged_in_validation_or_training_is_not_reported(monitor):
    callback = ASHA(monitor, mode="max" if monitor == "val_acc" else "min", max_t=2)
    fit(fused(LEARNING_RATES[:2]), [callback], max_epochs=2, num_sanity_val_steps=1)
    assert len(callback.endings) == 2


# -- Surrogate.load_from_checkpoint loads weights-only -------------------------------------------------------------


class MLPWithConfig(DigitsMLP):
    """A module as Hydra instantiates it: a nested config argument arrives as an OmegaConf container."""

    def __init__(self, hidden_dim: int = 32, lr: float = 0.1, schedule: Any = None, **digits: Any) -> None:
        super().__init__(hidden_dim=hidden_dim, lr=lr, **digits)
        self.save_hyperparameters()


class CreatesDirectory:
    """Unpickling it creates a directory: what a weights-only load must refuse to run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.makedirs, (str(self.path),))


def surrogate_checkpoint(tmp_path: Path) -> tuple[Surrogate, Path, L.LightningModule]:
    surrogate = Surrogate(MLPWithConfig, width="hidden_dim", ratio=4)
    model = surrogate.build(hidden_dim=64, schedule=OmegaConf.create({"milestones": [2, 4], "gamma": 0.5}))
    trainer = make_trainer(max_steps=2, limit_train_batches=2)
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=32))
    path = tmp_path / "surrogate.ckpt"
    trainer.save_checkpoint(path)
    return surrogate, path, model


def test_a_surrogate_checkpoint_with_hydra_configs_in_its_hparams_loads_weights_only(tmp_path):
    surrogate, path, model = surrogate_checkpoint(tmp_path)
    restored = surrogate.load_from_checkpoint(path)
    assert restored.hparams["schedule"] == {"milestones": [2, 4], "gamma": 0.5}
    x = torch.rand(3, 64)
    torch.testing.assert_close(restored(x), model(x))


def test_a_surrogate_checkpoint_holding_other_objects_is_refused_without_running_them(tmp_path):
    surrogate, path, _ = surrogate_checkpoint(tmp_path)
    marker = tmp_path / "ran"
    checkpoint = torch.load(path, weights_only=False)
    torch.save({**checkpoint, "extra": CreatesDirectory(marker)}, path)
    with pytest.raises(
        ValueError,
        match=rf"{re.escape(str(path))} holds objects that a weights-only load refuses "
        r"\(.*os\.makedirs.*\)\. If you trust the file, load it yourself",
    ):
        surrogate.load_from_checkpoint(path)
    assert not marker.exists()
    trusted = surrogate.load_from_checkpoint(torch.load(path, weights_only=False))  # the documented way round
    assert marker.exists()
    assert isinstance(trusted, MLPWithConfig)


class QuietInSanityCheck(DigitsMLP):
    """Logs nothing while Lightning's sanity check runs (a pattern some projects use)."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if not self.trainer.sanity_checking:
            super().validation_step(batch, batch_idx)


def test_a_module_that_logs_nothing_in_the_sanity_check_is_judged_at_the_first_validation():
    torch.manual_seed(0)
    module = FusedLightningModule([QuietInSanityCheck(hidden_dim=8, lr=lr) for lr in (0.1, 0.2)], backend="vmap")
    callback = ASHA("val_loss", max_t=2)
    fit(module, [callback], max_epochs=2, num_sanity_val_steps=1)
    assert len(callback.endings) == 2
