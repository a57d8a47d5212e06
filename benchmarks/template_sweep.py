"""A lightning-hydra-template-shaped project searched by lightning_hydro and by hydra-optuna-sweeper, in one run.

The project is a fresh copy of ``tests/sweeper/template_project`` (its ``src/train.py`` and configs
unchanged) with one added ``hparams_search`` file per sweeper. Both search the same 8 trials: the grid of
4 Adam learning rates x 2 batch sizes (lightning_hydro's ``grid`` sampler; Optuna's ``BruteForceSampler``,
which enumerates the same choices), with the template's default callbacks (ModelCheckpoint and
EarlyStopping on ``val/acc``), its CSV logger and ``trainer.test`` after fit, for ``--epochs`` epochs on the
full digits data. Each sweep is timed as a whole command (process start included), one after the other;
``--repeats`` alternates them and reports the median.

hydra-optuna-sweeper pins ``optuna<3`` while lightning_hydro's ``optuna`` extra needs ``>=3.4``; its plugin
imports and runs with the newer Optuna, so install it without its pins:

    pip install --no-deps hydra-optuna-sweeper
    python benchmarks/template_sweep.py                # 8 trials, 3 epochs, 1 repeat
    python benchmarks/template_sweep.py --repeats 3
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT = REPO / "tests" / "sweeper" / "template_project"

N_TRIALS = 8
LEARNING_RATES = "0.0003, 0.001, 0.003, 0.01"
BATCH_SIZES = "32, 64"

LIGHTNING_HYDRO = f"""# @package _global_
defaults:
  - override /hydra/sweeper: lightning_hydro
hydra:
  mode: MULTIRUN
  sweeper:
    sampler: grid
    metric: val/acc_best
    mode: max
    non_fusible: [data.batch_size]
    fusion_limit: 8
    params:
      model.optimizer.lr: choice({LEARNING_RATES})
      data.batch_size: choice({BATCH_SIZES})
"""

OPTUNA = f"""# @package _global_
defaults:
  - override /hydra/sweeper: optuna
  - override /hydra/sweeper/sampler: random  # a sampler node with only a seed, re-targeted below
optimized_metric: val/acc_best
hydra:
  mode: MULTIRUN
  sweeper:
    _target_: hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper
    direction: maximize
    n_trials: 8
    n_jobs: 1
    sampler:
      _target_: optuna.samplers.BruteForceSampler
      seed: 12345
    params:
      model.optimizer.lr: choice({LEARNING_RATES})
      data.batch_size: choice({BATCH_SIZES})
"""


def run(project: Path, search: str, sweep_dir: Path, epochs: int, log: Path) -> float:
    """``python src/train.py -m hparams_search=<search>`` on the full data; its wall time in seconds."""
    args = [
        "-m",
        f"hparams_search={search}",
        "logger=csv",
        "extras.print_config=false",
        f"trainer.max_epochs={epochs}",  # the full data: the template's trainer config sets no batch limits
        f"hydra.sweep.dir={sweep_dir}",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        # the template's trainer.test(ckpt_path=best) loads checkpoints whose hyperparameters hold Hydra partials:
        # torch >= 2.6 refuses them by default, fused or not (tests/sweeper/template_project.py)
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
    }
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(
            [sys.executable, "src/train.py", *args], cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0 and not _optuna_stopped_after_the_last_trial(log, sweep_dir):
        raise SystemExit(f"{search} failed (exit {proc.returncode}); see {log}")
    return elapsed


def _optuna_stopped_after_the_last_trial(log: Path, sweep_dir: Path) -> bool:
    """hydra-optuna-sweeper's known end of an exhausted BruteForceSampler study, after every trial finished.

    The sampler calls ``study.stop()`` when its last grid point is told, which Optuna refuses outside
    ``study.optimize`` ("Cannot tell a COMPLETE trial"): the sweep has trained and tested all its trials,
    but writes no ``optimization_results.yaml``. The timing is then complete; best values come from the
    trials' own CSV logs.
    """
    finished = [d for d in sweep_dir.iterdir() if d.is_dir() and d.name.isdigit() and _csv_values(d, "test/acc")]
    return "Cannot tell a COMPLETE trial" in log.read_text() and len(finished) == N_TRIALS


def best_lightning_hydro(sweep_dir: Path) -> float:
    return float(json.loads((sweep_dir / "results.json").read_text())["best"]["metrics"]["val/acc_best"])


def _csv_values(job_dir: Path, column: str) -> list[float]:
    """Every value of ``column`` in a job's CSV log (the template's ``logger=csv``)."""
    values: list[float] = []
    for path in job_dir.glob("csv/version_*/metrics.csv"):
        with path.open() as f:
            values += [float(row[column]) for row in csv.DictReader(f) if row.get(column)]
    return values


def best_optuna(sweep_dir: Path) -> float:
    """The best final ``val/acc_best`` over the trials' own CSV logs (one job directory per trial)."""
    return max(_csv_values(d, "val/acc_best")[-1] for d in sweep_dir.iterdir() if d.is_dir() and d.name.isdigit())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=None, help="keep the project and sweeps here")
    opts = parser.parse_args()
    root = opts.keep or Path(tempfile.mkdtemp(prefix="template_sweep_"))
    project = root / "project"
    shutil.rmtree(project, ignore_errors=True)
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__", "logs"))
    (project / "configs" / "hparams_search" / "bench_lightning_hydro.yaml").write_text(LIGHTNING_HYDRO)
    (project / "configs" / "hparams_search" / "bench_optuna.yaml").write_text(OPTUNA)
    times: dict[str, list[float]] = {"lightning_hydro": [], "optuna": []}
    best: dict[str, float] = {}
    for repeat in range(opts.repeats):
        for name, search, read_best in (
            ("lightning_hydro", "bench_lightning_hydro", best_lightning_hydro),
            ("optuna", "bench_optuna", best_optuna),
        ):
            sweep_dir = root / f"{name}_{repeat}"
            shutil.rmtree(sweep_dir, ignore_errors=True)
            elapsed = run(project, search, sweep_dir, opts.epochs, root / f"{name}_{repeat}.log")
            times[name].append(elapsed)
            best[name] = read_best(sweep_dir)
            print(f"repeat {repeat}: {name}: {elapsed:.1f} s, best val/acc_best {best[name]:.4f}", flush=True)
    lh, op = statistics.median(times["lightning_hydro"]), statistics.median(times["optuna"])
    print("\n| sweeper | wall time (s, median) | best val/acc_best |\n|---|---:|---:|")
    print(f"| lightning_hydro (grid, fused by batch size) | {lh:.1f} | {best['lightning_hydro']:.4f} |")
    print(f"| hydra-optuna-sweeper (BruteForceSampler) | {op:.1f} | {best['optuna']:.4f} |")
    print(f"\nratio optuna / lightning_hydro: {op / lh:.2f}x  (runs: {times})  in {root}")


if __name__ == "__main__":
    main()
