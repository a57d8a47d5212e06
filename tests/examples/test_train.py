"""examples/train.py, run as a user runs it: once (no -m), and as a tiny sweep (-m)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "model.hidden_dim=8",
    "trainer.max_epochs=1",
    "+trainer.limit_train_batches=2",
    "+trainer.limit_val_batches=1",
]


def train(*args: str) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train.py"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_a_plain_run_trains_once(tmp_path):
    out = train(*TINY, f"hydra.run.dir={tmp_path}")
    assert "trial 0: completed after 1 epochs" in out
    assert (tmp_path / "trial_0000" / "checkpoints" / "last.ckpt").is_file()
    assert not (tmp_path / "results.json").exists()


def test_the_sweep(tmp_path):
    out = train("-m", *TINY, f"hydra.sweep.dir={tmp_path}", "hydra.sweeper.n_trials=3")
    assert "Best 3 of 3 trials by val_acc (max):" in out
    results = json.loads((tmp_path / "results.json").read_text())
    assert sorted(t["trial_id"] for t in results["trials"]) == [0, 1, 2]
    assert {"model.lr", "model.momentum", "data.batch_size"} == set(results["trials"][0]["params"])
