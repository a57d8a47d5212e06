"""A fresh copy of the lightning-hydra-template-shaped fixture project, and sweeps of it in a subprocess.

``template_project/`` is the project as the template's users have it, our own code in the template's shape:
``src/train.py`` (``extras``, a ``task_wrapper``, ``cfg.data``/``model``/``callbacks``/``logger``/``trainer``
instantiated, ``log_hyperparameters``, fit, test with the best checkpoint, the metrics merged and
``get_metric_value(cfg.optimized_metric)`` returned), ``src/utils``, a module shaped like the template's
``MNISTLitModule`` and its configs (ModelCheckpoint and EarlyStopping on ``val/acc``, RichModelSummary,
RichProgressBar). ``template_search/`` holds the one file a user adds to switch its search to lightning_hydro.

Two things of the environment, not of the project: the data is scikit-learn's digits (no download), and
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``: the template's ``trainer.test(ckpt_path=best)`` loads a checkpoint whose
hyperparameters hold Hydra's partials and ListConfigs, which ``torch.load`` refuses by default since torch 2.6
(Lightning 2.6 passes no ``weights_only``): the unfused template fails there too without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROJECT = HERE / "template_project"
SEARCH_FILE = HERE / "template_search" / "mnist_lightning_hydro.yaml"
# a few batches per epoch: the tests run in seconds (the template's trainer config sets no limits: `+`)
FEW_BATCHES = ["+trainer.limit_train_batches=3", "+trainer.limit_val_batches=2", "+trainer.limit_test_batches=2"]
_RETRIEVED = re.compile(r"Retrieved metric value! <(?P<name>[^=]+)=(?P<value>[^>]+)>")


def make_project(root: Path, *, add_search: bool = True) -> Path:
    """Copy the fixture project to ``root/project``; add the lightning_hydro hparams_search file.

    Raises:
        RuntimeError: without rich, which the template's callbacks and config printing draw with.
    """
    if importlib.util.find_spec("rich") is None:
        raise RuntimeError(
            "The template project's RichProgressBar, RichModelSummary and config tree need rich, as "
            "lightning-hydra-template's do; install the test dependencies: pip install -e '.[dev]'."
        )
    project = root / "project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__", "logs"))
    if add_search:
        shutil.copy(SEARCH_FILE, project / "configs" / "hparams_search" / SEARCH_FILE.name)
    return project


def train_command(project: Path, args: list[str]) -> tuple[list[str], dict[str, str]]:
    """``python src/train.py <args>`` and its environment (this checkout importable, as if installed)."""
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "HYDRA_FULL_ERROR": "1",
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",  # see the module docstring
    }
    return [sys.executable, str(project / "src" / "train.py"), *args], env


def run_train(project: Path, args: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``python src/train.py <args>`` in ``project`` to the end; stdout and stderr together."""
    command, env = train_command(project, args)
    return subprocess.run(
        command, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def retrieved_values(job_dir: Path) -> dict[str, float]:
    """What the job's ``get_metric_value`` read back and returned (its log line in ``<job_dir>/train.log``)."""
    text = (job_dir / "train.log").read_text()
    return {m["name"]: float(m["value"]) for m in _RETRIEVED.finditer(text)}


def best_of(trials: Sequence[dict[str, Any]], metric: str, mode: str) -> dict[str, Any]:
    """The trial with the best ``metric`` (ties: the lowest id), as the sweeper and the fused group rank them."""
    scored = [t for t in trials if metric in t["metrics"]]
    sign = -1.0 if mode == "max" else 1.0
    return min(scored, key=lambda t: (sign * t["metrics"][metric], t["trial_id"]))
