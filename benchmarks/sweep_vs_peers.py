"""The README's sweep (examples/train.py -m) against Optuna and Ray Tune on the same task, seeds interleaved.

Every method searches the same space (``model.lr`` log-uniform in [1e-3, 1], ``model.momentum`` in
[0, 0.99], ``data.batch_size`` in {32, 64, 128}) for the same digits MLP (width 64, depth 2, SGD), trained
for at most ``--epochs`` epochs on scikit-learn's digits, ``--n-trials`` configurations, on the CPU:

- ``lh-random``, ``lh-tpe``: ``python examples/train.py -m`` (lightning_hydro's sweeper, ASHA, fused groups),
  with ``hydra.sweeper.sampler=random`` / ``tpe`` and ``hydra.sweeper.plots=false``;
- ``optuna-tpe-sh``, ``optuna-random-sh``: Optuna's TPE / random sampler with ``SuccessiveHalvingPruner``
  (min resource 1 epoch, reduction factor 3), pruning through optuna-integration's Lightning callback;
- ``optuna-tpe``: Optuna's TPE without pruning (every trial trains every epoch);
- ``ray-asha``: Ray Tune's ``ASHAScheduler`` (grace period 1, reduction factor 3; random search), one trial
  per CPU (skipped if ``ray`` is not installed).

Each run is a whole command (``python ...``: process start, imports, training, reports) timed from outside.
The common import (``import torch, lightning``: every method pays it once) is timed separately, as
``--import-repeats`` fresh processes, and its median is subtracted for the "after the import" column.
Methods are interleaved (seed 0 of every method, then seed 1, ...) so that changes in machine load hit all.

    python benchmarks/sweep_vs_peers.py                                  # 32 trials, 9 epochs, seeds 0-2
    python benchmarks/sweep_vs_peers.py --n-trials 128 --methods lh-tpe optuna-tpe-sh
    python benchmarks/sweep_vs_peers.py --quick                          # 4 trials, 2 epochs: the plumbing

Results: ``benchmarks/results/sweep_vs_peers.md`` and ``.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
METHODS = ("lh-random", "lh-tpe", "optuna-tpe-sh", "optuna-random-sh", "optuna-tpe", "ray-asha")
BATCH_SIZES = (32, 64, 128)


def _env() -> dict[str, str]:
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def timed(command: list[str], log: Path) -> float:
    """Run ``command`` from the repository root; return its wall time in seconds."""
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(command, cwd=REPO, env=_env(), stdout=out, stderr=subprocess.STDOUT)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed (exit {proc.returncode}); see {log}")
    return elapsed


def import_seconds(repeats: int, workdir: Path) -> list[float]:
    """Wall times of ``python -c 'import torch, lightning'`` (the import every method pays)."""
    return [timed([sys.executable, "-c", "import torch, lightning"], workdir / "import.log") for _ in range(repeats)]


# -- lightning_hydro ---------------------------------------------------------------------------------------


def run_lightning_hydro(sampler: str, seed: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    sweep_dir = workdir / f"lh-{sampler}-{seed}"
    command = [
        sys.executable,
        "examples/train.py",
        "-m",
        f"hydra.sweep.dir={sweep_dir}",
        f"hydra.sweeper.sampler={sampler}",
        f"hydra.sweeper.seed={seed}",
        f"hydra.sweeper.n_trials={args.n_trials}",
        f"trainer.max_epochs={args.epochs}",
        "hydra.sweeper.plots=false",
    ]
    seconds = timed(command, workdir / f"lh-{sampler}-{seed}.log")
    trials = json.loads((sweep_dir / "results.json").read_text())["trials"]
    full = [t["metrics"]["val_acc"] for t in trials if t["budget"] >= args.epochs]
    return {
        "seconds": seconds,
        "trials": len(trials),
        "trial_epochs": sum(t["budget"] for t in trials),
        "best_val_acc": max(full) if full else None,
    }


# -- Optuna and Ray Tune: run in a child process (``--child``), so that each is timed as a whole command -------


def child_optuna(method: str, seed: int, n_trials: int, epochs: int) -> dict[str, Any]:
    import lightning as L
    import optuna
    from optuna_integration import PyTorchLightningPruningCallback

    from lightning_hydro.demos import DigitsDataModule, DigitsMLP

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.RandomSampler(seed=seed) if "random" in method else optuna.samplers.TPESampler(seed=seed)
    pruner: optuna.pruners.BasePruner = optuna.pruners.NopPruner()
    if method.endswith("-sh"):
        pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    epochs_trained: list[int] = []

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("lr", 1e-3, 1.0, log=True)
        momentum = trial.suggest_float("momentum", 0.0, 0.99)
        batch_size = trial.suggest_categorical("batch_size", BATCH_SIZES)
        L.seed_everything(0, verbose=False)  # as conf/train.yaml's seed: 0 seeds every lightning_hydro trial
        model = DigitsMLP(hidden_dim=64, depth=2, lr=lr, momentum=momentum, optimizer="sgd")
        callbacks = [PyTorchLightningPruningCallback(trial, monitor="val_acc")] if method.endswith("-sh") else []
        trainer = L.Trainer(**_trainer_kwargs(epochs), callbacks=callbacks)
        try:
            trainer.fit(model, datamodule=DigitsDataModule(batch_size=batch_size))
        except optuna.TrialPruned:
            epochs_trained.append(int(trainer.current_epoch) + 1)  # pruned at the end of that epoch's validation
            raise
        epochs_trained.append(int(trainer.current_epoch))
        return float(trainer.callback_metrics["val_acc"])

    study.optimize(objective, n_trials=n_trials)
    complete = [t.value for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    return {"trials": len(study.trials), "trial_epochs": sum(epochs_trained), "best_val_acc": max(complete)}


def child_ray(seed: int, n_trials: int, epochs: int) -> dict[str, Any]:
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    def trainable(config: dict[str, Any]) -> None:
        import lightning as L

        from lightning_hydro.demos import DigitsDataModule, DigitsMLP

        class Report(L.Callback):
            def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
                if not trainer.sanity_checking:
                    tune.report({"val_acc": float(trainer.callback_metrics["val_acc"])})

        L.seed_everything(0, verbose=False)
        model = DigitsMLP(hidden_dim=64, depth=2, lr=config["lr"], momentum=config["momentum"], optimizer="sgd")
        trainer = L.Trainer(**_trainer_kwargs(epochs), callbacks=[Report()])
        trainer.fit(model, datamodule=DigitsDataModule(batch_size=config["batch_size"]))

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space={
            "lr": tune.loguniform(1e-3, 1.0),
            "momentum": tune.uniform(0.0, 0.99),
            "batch_size": tune.choice(list(BATCH_SIZES)),
        },
        tune_config=tune.TuneConfig(
            metric="val_acc",
            mode="max",
            num_samples=n_trials,
            scheduler=ASHAScheduler(max_t=epochs, grace_period=1, reduction_factor=3),
            search_alg=tune.search.BasicVariantGenerator(random_state=seed),
        ),
        run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(), verbose=0),
    )
    results = tuner.fit()
    frame = results.get_dataframe()
    full = frame[frame["training_iteration"] >= epochs]["val_acc"]
    return {
        "trials": len(frame),
        "trial_epochs": int(frame["training_iteration"].sum()),
        "best_val_acc": float(full.max()) if len(full) else None,
    }


def _trainer_kwargs(epochs: int) -> dict[str, Any]:
    return {
        "max_epochs": epochs,
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "log_every_n_steps": 10,
    }


def run_child(method: str, seed: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    out = workdir / f"{method}-{seed}.json"
    command = [sys.executable, __file__, "--child", method, "--seed", str(seed), "--n-trials", str(args.n_trials)]
    seconds = timed([*command, "--epochs", str(args.epochs), "--output", str(out)], workdir / f"{method}-{seed}.log")
    return {"seconds": seconds, **json.loads(out.read_text())}


# -- the report ---------------------------------------------------------------------------------------------


def report(runs: dict[str, dict[int, dict[str, Any]]], imports: list[float], args: argparse.Namespace) -> str:
    common = statistics.median(imports)
    lines = [
        f"# Sweep vs peers: {args.n_trials} trials, {args.epochs} epochs, seeds {args.seeds}",
        "",
        f"Command: `python benchmarks/sweep_vs_peers.py {' '.join(sys.argv[1:])}`",
        "",
        f"Common import (`import torch, lightning`, median of {len(imports)} fresh processes): {common:.1f} s",
        "",
        "| method | seeds | wall s (median) | after import s | trial-epochs (mean) | best val_acc per seed | mean |",
        "|---|---|---:|---:|---:|---|---:|",
    ]
    for method, by_seed in runs.items():
        walls = [r["seconds"] for r in by_seed.values()]
        bests = [r["best_val_acc"] for r in by_seed.values()]
        best_text = " / ".join("-" if b is None else f"{b:.4f}" for b in bests)
        known = [b for b in bests if b is not None]
        mean = f"{statistics.mean(known):.4f}" if known else "-"
        epochs = statistics.mean(r["trial_epochs"] for r in by_seed.values())
        median = statistics.median(walls)
        seeds = ", ".join(str(seed) for seed in by_seed)
        lines.append(
            f"| {method} | {seeds} | {median:.1f} | {median - common:.1f} | {epochs:.0f} | {best_text} | {mean} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-trials", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=9)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--import-repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4 trials of 2 epochs, seed 0: checks the plumbing")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "sweep_vs_peers.md")
    parser.add_argument("--from-json", type=Path, help="rewrite the report of an earlier run's .json (no training)")
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child == "ray-asha":
            result = child_ray(args.seed, args.n_trials, args.epochs)
        else:
            result = child_optuna(args.child, args.seed, args.n_trials, args.epochs)
        args.output.write_text(json.dumps(result))
        return
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        runs = {m: {int(seed): r for seed, r in by_seed.items()} for m, by_seed in saved["runs"].items() if by_seed}
        print(write_report(runs, saved["imports"], args))
        return
    if args.quick:
        args.n_trials, args.epochs, args.seeds, args.import_repeats = 4, 2, [0], 1
    methods = [m for m in args.methods if m != "ray-asha" or _has("ray")]
    workdir = Path(tempfile.mkdtemp(prefix="sweep_vs_peers_"))
    imports = import_seconds(args.import_repeats, workdir)
    runs: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in methods}
    for seed in args.seeds:  # interleaved: seed 0 of every method, then seed 1, ...
        for method in methods:
            if method.startswith("lh-"):
                runs[method][seed] = run_lightning_hydro(method[3:], seed, args, workdir)
            else:
                runs[method][seed] = run_child(method, seed, args, workdir)
            print(method, seed, runs[method][seed], flush=True)
            write_report({m: r for m, r in runs.items() if r}, imports, args)  # after every run: partial results
    print(write_report(runs, imports, args))


def write_report(runs: dict[str, dict[int, dict[str, Any]]], imports: list[float], args: argparse.Namespace) -> str:
    """Write the report of the runs done so far (markdown and JSON); return the markdown."""
    text = report(runs, imports, args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    args.output.with_suffix(".json").write_text(json.dumps({"imports": imports, "runs": runs}, indent=1))
    return text


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
