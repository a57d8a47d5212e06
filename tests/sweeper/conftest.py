"""Helpers to run real sweeps of ``examples/train.py`` through Hydra, in this process or in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hydra.test_utils.test_utils import SweepTaskFunction
from omegaconf import DictConfig

from lightning_hydro.sweeper import fit_from_config

# The fixture projects are apps run by the tests in subprocesses; not test modules (nor doctests).
collect_ignore = ["template_project", "torchless_app"]

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train.py"
# Train for seconds: a narrow MLP, two batches per epoch.
TINY = [
    "trainer.accelerator=cpu",  # conf/train.yaml follows the machine (auto); these tests time and compare on the CPU
    "hydra.sweeper.scheduler.name=none",  # the plumbing; early stopping has tests of its own
    "trainer.max_epochs=1",
    "model.hidden_dim=8",
    "+trainer.limit_train_batches=2",
    "+trainer.limit_val_batches=1",
    "trainer.log_every_n_steps=1",
]


class KeptSweep(SweepTaskFunction):
    """Hydra's in-process sweep runner, keeping the sweep directory for the test to inspect."""

    def __exit__(self, *exc: Any) -> None:
        pass


def run_sweep(sweep_dir: Path, overrides: list[str], task_function: Callable[[DictConfig], Any] | None = None) -> Any:
    """Run ``examples/train.py -m <overrides>`` in this process; return what the sweeper returned.

    ``task_function``: the job's task (default: ``fit_from_config``, what ``examples/train.py`` runs).
    """
    sweep = KeptSweep()
    sweep.calling_file = str(TRAIN)
    sweep.calling_module = None
    sweep.task_function = fit_from_config if task_function is None else task_function
    sweep.config_path = "../conf"
    sweep.config_name = "train"
    sweep.overrides = overrides
    sweep.temp_dir = str(sweep_dir)
    with sweep:
        return sweep.returns


def train_subprocess(args: list[str], *, extra_path: Path | None = None, **popen: Any) -> subprocess.Popen:
    """Start ``python examples/train.py <args>`` with this checkout (and ``extra_path``) importable."""
    paths = [str(REPO), *([str(extra_path)] if extra_path else []), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    return subprocess.Popen(
        [sys.executable, str(TRAIN), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def read_results(sweep_dir: Path) -> dict[str, Any]:
    return json.loads((sweep_dir / "results.json").read_text())


@pytest.fixture(autouse=True)
def _restore_hydra(hydra_restore_singletons: None) -> None:
    """Every test leaves Hydra's global state as it found it."""
