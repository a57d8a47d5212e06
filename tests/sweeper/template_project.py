"""A fresh copy of the lightning-hydra-template-shaped fixture project, and sweeps of it in a subprocess.

``template_project/`` is the project as its authors would have it (``src/train.py`` instantiating ``cfg.data``,
``cfg.model``, ``cfg.callbacks``, ``cfg.logger`` and ``cfg.trainer``); ``template_search/`` holds the one
file a user adds to switch its search to lightning_hydro.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROJECT = HERE / "template_project"
SEARCH_FILE = HERE / "template_search" / "mnist_lightning_hydro.yaml"


def make_project(root: Path, *, add_search: bool = True) -> Path:
    """Copy the fixture project to ``root/project``; add the lightning_hydro hparams_search file."""
    project = root / "project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__", "logs"))
    if add_search:
        shutil.copy(SEARCH_FILE, project / "configs" / "hparams_search" / SEARCH_FILE.name)
    return project


def train_command(project: Path, args: list[str]) -> tuple[list[str], dict[str, str]]:
    """``python src/train.py <args>`` and its environment (this checkout importable, as if installed)."""
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "HYDRA_FULL_ERROR": "1"}
    return [sys.executable, str(project / "src" / "train.py"), *args], env


def run_train(project: Path, args: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``python src/train.py <args>`` in ``project`` to the end; stdout and stderr together."""
    command, env = train_command(project, args)
    return subprocess.run(
        command, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())
