"""examples/train.py, run as a user runs it (its own command line, in this process): once, and with -m."""

import json
import runpy
import sys
from pathlib import Path

import pytest

from tests.helpers import wait_for_file

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "trainer.accelerator=cpu",  # conf/train.yaml follows the machine (auto); these tests time and compare on the CPU
    "model.hidden_dim=8",
    "trainer.max_epochs=1",
    "+trainer.limit_train_batches=2",
    "+trainer.limit_val_batches=1",
]


def run_example(monkeypatch, *args):
    """``python examples/train.py <args>``, in this process."""
    script = REPO / "examples" / "train.py"
    monkeypatch.setattr(sys, "argv", [str(script), *args])
    runpy.run_path(str(script), run_name="__main__")


@pytest.fixture(autouse=True)
def _restore_hydra(hydra_restore_singletons):
    """Leave Hydra's global state as it was."""


def test_a_plain_run_trains_once(tmp_path, monkeypatch):
    run_example(monkeypatch, *TINY, f"hydra.run.dir={tmp_path}")
    assert "trial 0 (seed 0): completed after 1 epochs" in (tmp_path / "train.log").read_text()
    assert (tmp_path / "trial_0000" / "checkpoints" / "last.ckpt").is_file()
    assert not (tmp_path / "results.json").exists()


def test_the_sweep(tmp_path, monkeypatch):
    run_example(monkeypatch, "-m", *TINY, f"hydra.sweep.dir={tmp_path}", "hydra.sweeper.n_trials=2")
    results = json.loads((tmp_path / "results.json").read_text())
    assert sorted(t["trial_id"] for t in results["trials"]) == [0, 1]
    assert set(results["trials"][0]["params"]) == {"model.lr", "model.momentum", "data.batch_size"}
    assert all(t["status"] == "completed" for t in results["trials"])
    assert wait_for_file(tmp_path / "plots" / "learning_curves.png")  # drawn in the background
