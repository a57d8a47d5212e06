"""After a fused fit, the user's ``ModelCheckpoint`` answers as for one model: ``best_model_path`` is the best trial's
own checkpoint, which ``MyModule.load_from_checkpoint`` loads; the group checkpoint has its own name and loader
(lightning_hydro/fused/lightning/model_checkpoint.py, lightning_hydro/fused/lightning/group_checkpoint.py)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos.template_mnist import DigitsMNISTDataModule, MNISTLitModule, SimpleDenseNet
from tests.helpers import make_trainer, max_state_difference

NET = dict(lin1_size=32, lin2_size=32, lin3_size=16)
LIMITS = dict(max_epochs=3, limit_train_batches=4, limit_val_batches=2, limit_test_batches=2)
RATES = (1e-4, 3e-3, 2e-2)
TRUSTED: dict[str, Any] = {"weights_only": False}  # the template's hparams hold optimizer partials


def template(lr: float, seed: int) -> MNISTLitModule:
    torch.manual_seed(seed)
    return MNISTLitModule(
        net=SimpleDenseNet(**NET), optimizer=functools.partial(torch.optim.Adam, lr=lr), scheduler=None
    )


def factory(tid: int) -> MNISTLitModule:
    """The template saves its hyperparameters with ignore=["net"]: a trial is rebuilt by a factory."""
    return template(RATES[tid], tid)


def fit_with_user_checkpoint(root: Path) -> tuple[FusedLightningModule, L.Trainer, ModelCheckpoint]:
    mine = ModelCheckpoint(
        dirpath=str(root), filename="epoch_{epoch:03d}", monitor="val/acc", mode="max", save_last=True,
        auto_insert_metric_name=False,
    )  # fmt: skip
    # the loop with each trial's own Adam: bitwise its run alone (on vmap, the biases that feed BatchNorm get no
    # gradient but rounding, which Adam amplifies: tests/fused/lightning/test_callbacks.py compares those runs)
    fused = FusedLightningModule(
        [factory(t) for t in range(3)], backend="loop", optimizer_path="universal", summary=False
    )
    trainer = make_trainer(callbacks=[mine], enable_checkpointing=True, **LIMITS)
    torch.manual_seed(1234)  # the template's loader shuffles with the global generator
    trainer.fit(fused, datamodule=DigitsMNISTDataModule(batch_size=64))
    return fused, trainer, mine


def test_best_model_path_is_the_best_trials_own_checkpoint_for_the_trainer_and_the_users_callback(tmp_path):
    _, trainer, mine = fit_with_user_checkpoint(tmp_path)
    callback = trainer.checkpoint_callback
    assert callback is not mine  # the per-trial version stands in for it during the fit
    trial_bests = {tid: (float(c.best_model_score), c.best_model_path) for tid, c in callback.trial_callbacks.items()}
    best_tid = max(trial_bests, key=lambda t: trial_bests[t][0])
    assert len({score for score, _ in trial_bests.values()}) > 1  # the trials differ: the best one is chosen
    for answer in (callback, mine):
        assert answer.best_model_path == trial_bests[best_tid][1]
        assert Path(answer.best_model_path).parent == tmp_path / f"trial_{best_tid}"
        assert float(answer.best_model_score) == trial_bests[best_tid][0]
        assert list(answer.best_k_models) == [answer.best_model_path]  # save_top_k=1 over every trial's checkpoints
        assert answer.kth_best_model_path == answer.best_model_path
        assert answer.last_model_path == str(tmp_path / "last.ckpt")  # the group's: it resumes the group
    loaded = MNISTLitModule.load_from_checkpoint(mine.best_model_path, net=SimpleDenseNet(**NET), **TRUSTED)
    best_epoch = torch.load(mine.best_model_path, **TRUSTED)["epoch"]
    own = template(RATES[best_tid], best_tid)
    torch.manual_seed(1234)
    make_trainer(**{**LIMITS, "max_epochs": best_epoch + 1}).fit(own, datamodule=DigitsMNISTDataModule(batch_size=64))
    assert max_state_difference(loaded, own) == 0.0  # the best trial at its best epoch
    group = torch.load(callback.group_model_path, **TRUSTED)
    assert Path(callback.group_model_path).parent == tmp_path
    assert group["lightning_hydro"]["trial_ids"] == [0, 1, 2]


def test_trial_best_model_paths_names_each_trials_own_best_checkpoint(tmp_path):
    _, trainer, mine = fit_with_user_checkpoint(tmp_path)
    paths = trainer.checkpoint_callback.trial_best_model_paths
    assert sorted(paths) == [0, 1, 2]
    for tid, path in paths.items():
        assert Path(path).parent == tmp_path / f"trial_{tid}"
        assert torch.load(path, **TRUSTED)["lightning_hydro_trial"] == {"trial_id": tid}  # the trial's own module
    assert mine.best_model_path in paths.values()  # the best of the trials' bests


@pytest.mark.parametrize("ckpt", ["best_model_path", "best"])
def test_testing_the_fused_module_from_the_best_trials_checkpoint_tests_every_trial_from_the_group(tmp_path, ckpt):
    """The template's train.py: trainer.test(model, ckpt_path=trainer.checkpoint_callback.best_model_path)."""
    fused, trainer, _ = fit_with_user_checkpoint(tmp_path)
    data = DigitsMNISTDataModule(batch_size=64)
    from_group = trainer.test(fused, datamodule=data, ckpt_path=trainer.checkpoint_callback.group_model_path, **TRUSTED)
    path = trainer.checkpoint_callback.best_model_path if ckpt == "best_model_path" else "best"
    # alone, "best" tests a trial at its best weights; the group checkpoint holds the latest: said, not left silent
    with pytest.warns(UserWarning, match=r"holds each trial's weights of when it was written \(the latest\), not"):
        from_best = trainer.test(fused, datamodule=data, ckpt_path=path, **TRUSTED)
    assert {f"test/acc/trial_{t}" for t in range(3)} <= set(from_best[0])
    assert from_best == from_group


def test_a_trials_own_checkpoint_given_to_a_new_trainer_or_to_a_fit_says_which_checkpoint_to_pass(tmp_path):
    fused, trainer, mine = fit_with_user_checkpoint(tmp_path)
    data = DigitsMNISTDataModule(batch_size=64)
    fresh = FusedLightningModule([factory(t) for t in range(3)], backend="vmap", summary=False)
    with pytest.raises(
        ValueError,
        match=r"trial_\d/epoch_00\d\.ckpt is trial \d's own checkpoint \(written by a per-trial ModelCheckpoint\): "
        r"load it into the trial's class, MyModule\.load_from_checkpoint\(path\), to use that trial\. To evaluate "
        r"every trial of the group, pass its group checkpoint \(the \.ckpt files directly in the callback's dirpath",
    ):
        make_trainer(**LIMITS).test(fresh, datamodule=data, ckpt_path=mine.best_model_path, **TRUSTED)
    with pytest.raises(
        ValueError,
        match=r"is trial \d's own checkpoint .* A fused group resumes from its group checkpoint: pass "
        r"trainer\.checkpoint_callback\.group_model_path \(.*epoch_002\.ckpt\) or last\.ckpt",
    ):
        trainer.fit(fused, datamodule=data, ckpt_path=mine.best_model_path, **TRUSTED)


def test_load_group_checkpoint_builds_every_trial_without_a_trainer(tmp_path):
    fused, trainer, mine = fit_with_user_checkpoint(tmp_path)
    group = FusedLightningModule.load_group_checkpoint(
        trainer.checkpoint_callback.group_model_path, trial_factory=factory, summary=False, **TRUSTED
    )
    assert group.trial_ids == [0, 1, 2]
    for tid in range(3):
        assert max_state_difference(group.unfuse(tid), fused.unfuse(tid)) == 0.0
    with pytest.raises(
        ValueError,
        match=r"load_group_checkpoint: .*trial_\d/epoch_00\d\.ckpt is a trial's own checkpoint; load a trial's "
        r"checkpoint into its own class \(MyModule\.load_from_checkpoint\), and pass a group checkpoint here",
    ):
        FusedLightningModule.load_group_checkpoint(mine.best_model_path, trial_factory=factory, **TRUSTED)


class EndTrialOne(L.Callback):
    """Ends trial 1 after the first validation, as early stopping does."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if not trainer.sanity_checking and 1 in pl_module.trial_ids:
            pl_module.stop_trial(1, "ended by the test")


def every_checkpoint(root: Path) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=str(root), monitor="val/acc", mode="max", save_top_k=-1, save_last=True)


def test_after_a_resume_the_summary_still_covers_the_trials_that_had_ended(tmp_path):
    fused = FusedLightningModule([factory(t) for t in range(3)], backend="vmap", summary=False)
    first = every_checkpoint(tmp_path)
    trainer = make_trainer(callbacks=[first, EndTrialOne()], enable_checkpointing=True, **{**LIMITS, "max_epochs": 2})
    trainer.fit(fused, datamodule=DigitsMNISTDataModule(batch_size=64))
    ended = {path for path in first.best_k_models if Path(path).parent.name == "trial_1"}
    assert len(ended) == 1  # trial 1's checkpoint of the epoch it ended at
    resumed = FusedLightningModule([factory(t) for t in range(3)], backend="vmap", summary=False)
    again = every_checkpoint(tmp_path)
    trainer = make_trainer(callbacks=[again], enable_checkpointing=True, **LIMITS)
    trainer.fit(resumed, datamodule=DigitsMNISTDataModule(batch_size=64), ckpt_path=first.last_model_path, **TRUSTED)
    assert resumed.trial_ids == [0, 2]
    assert ended <= set(again.best_k_models)  # from the restored state of trial 1's copy, never made again
    assert set(first.best_k_models) < set(again.best_k_models)  # and the third epoch's of trials 0 and 2


def test_the_group_checkpoints_name_shows_no_metric_it_does_not_have(tmp_path):
    """Before, ``filename="{epoch}-{val/loss:.2f}"`` named the group's checkpoint ``epoch=2-val/loss=0.00.ckpt``:
    Lightning writes a missing metric as 0, which passed for a score. Each trial's own files keep the user's name."""
    mine = ModelCheckpoint(dirpath=str(tmp_path), filename="{epoch}-{val/loss:.2f}", monitor="val/loss")
    fused = FusedLightningModule([factory(t) for t in range(2)], backend="loop", summary=False)
    trainer = make_trainer(callbacks=[mine], enable_checkpointing=True, **LIMITS)
    trainer.fit(fused, datamodule=DigitsMNISTDataModule(batch_size=64))
    files = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.ckpt")]  # ("val/" makes a folder)
    group_files = sorted(name for name in files if not name.startswith("trial_"))
    trial_files = sorted(name for name in files if name.startswith("trial_"))
    assert group_files
    assert all("loss" not in name for name in group_files), group_files
    assert trial_files
    assert all("loss=" in name and "loss=0.00" not in name for name in trial_files), trial_files
