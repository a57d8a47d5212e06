"""examples/train.py with conf/train_resnet.yaml (ResNet-18 on the 32x32 digits), as a user runs it: -m, tiny."""

import json

import pytest

from tests.examples.test_train import run_example


@pytest.fixture(autouse=True)
def _restore_hydra(hydra_restore_singletons):
    """Leave Hydra's global state as it was."""


def test_the_resnet_sweep_fuses_its_trials_into_one_group(tmp_path, monkeypatch):
    run_example(
        monkeypatch,
        "-m",
        "--config-name",
        "train_resnet",
        "trainer.accelerator=cpu",
        "model.width=4",
        "+fused.backend=vmap",  # auto's timing of every backend would double this test's time
        "trainer.max_epochs=1",
        "+trainer.limit_train_batches=2",
        "+trainer.limit_val_batches=1",
        f"hydra.sweep.dir={tmp_path}",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.plots=false",
    )
    results = json.loads((tmp_path / "results.json").read_text())
    trials = results["trials"]
    assert sorted(t["trial_id"] for t in trials) == [0, 1, 2]
    assert {t["group"] for t in trials} == {"group_0000"}  # same width, channels and batch: one fused group
    assert set(trials[0]["params"]) == {"model.lr", "model.momentum", "model.weight_decay"}
    assert all(t["status"] == "completed" and 0.0 <= t["metrics"]["val_acc"] <= 1.0 for t in trials)
    assert {t["backend"] for t in trials} == {"vmap"}
