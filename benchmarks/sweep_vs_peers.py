"""The README's sweep (examples/train.py -m) against Optuna and Ray Tune on the same task, seeds interleaved.

Every method searches the same space for the same model, trained for at most ``--epochs`` epochs,
``--n-trials`` configurations, on ``--accelerator`` (``cpu`` by default; ``gpu``: one CUDA device). Tasks:

- ``--task mlp`` (default): the digits MLP of ``conf/train.yaml`` (width 64, depth 2, SGD), ``model.lr``
  log-uniform in [1e-3, 1], ``model.momentum`` in [0, 0.99], ``data.batch_size`` in {32, 64, 128};
- ``--task resnet18``: ResNet-18 (``lightning_hydro.demos.DigitsResNet``, first-stage width ``--width``, 64 by
  default: the real one) on the digits upsampled to 32x32, 3 channels, batch 128 (``conf/train_resnet.yaml``),
  SGD's ``model.lr`` log-uniform in [1e-3, 1], ``model.momentum`` in [0, 0.99], ``model.weight_decay``
  log-uniform in [1e-5, 1e-2].

Methods:

- ``lh-random``, ``lh-tpe``: ``python examples/train.py -m`` (lightning_hydro's sweeper, ASHA, fused groups on
  the same device), with ``hydra.sweeper.sampler=random`` / ``tpe`` and ``hydra.sweeper.plots=false``;
- ``optuna-tpe-sh``, ``optuna-random-sh``: Optuna's TPE / random sampler with ``SuccessiveHalvingPruner``
  (min resource 1 epoch, reduction factor 3), pruning through optuna-integration's Lightning callback;
- ``optuna-tpe``: Optuna's TPE without pruning (every trial trains every epoch);
- ``ray-asha``: Ray Tune's ``ASHAScheduler`` (grace period 1, reduction factor 3; random search), one trial
  per CPU (CPU only; skipped if ``ray`` is not installed).

Optuna runs the way its users parallelise it, once per ``--workers`` K: K processes started together, each
calling ``study.optimize`` on one study until ``--n-trials`` trials exist in total (``MaxTrialsCallback``),
sharing the study through a ``JournalStorage`` file (K = 1: one process, an in-memory study, as before) and the
device; each worker's sampler is seeded ``seed + 1000 * worker`` and, for K > 1, uses 1/K of the torch threads
one process would use (``--threads N`` sets ``OMP_NUM_THREADS=N`` for every command: on a small shared machine,
``--threads 1`` keeps OpenMP threads from spinning against each other). The K processes are timed together,
from the first start to the last exit.

Each run is a whole command (``python ...``: process start, imports, training, reports) timed from outside.
The common import (``import torch, lightning``: every method pays it once) is timed separately, as
``--import-repeats`` fresh processes, and its median is subtracted for the "after the import" column.
Methods are interleaved (seed 0 of every method, then seed 1, ...) so that changes in machine load hit all.
With ``--accelerator gpu``, ``nvidia-smi`` is polled during each run: the peak device memory in use above what
was in use before the run (all processes together, CUDA contexts included).

    python benchmarks/sweep_vs_peers.py                                  # 32 trials, 9 epochs, seeds 0-2
    python benchmarks/sweep_vs_peers.py --n-trials 128 --methods lh-tpe optuna-tpe-sh
    python benchmarks/sweep_vs_peers.py --quick                          # 4 trials, 2 epochs: the plumbing
    python benchmarks/sweep_vs_peers.py --accelerator gpu --task resnet18 \
        --methods lh-random lh-tpe optuna-tpe-sh --workers 1 4 16        # issue 22's GPU sweep
    python benchmarks/sweep_vs_peers.py --task resnet18 --quick --methods lh-tpe optuna-tpe-sh --workers 1 2

Results: ``benchmarks/results/sweep_vs_peers.md`` and ``.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
METHODS = ("lh-random", "lh-tpe", "optuna-tpe-sh", "optuna-random-sh", "optuna-tpe", "ray-asha")
TASKS = ("mlp", "resnet18")
BATCH_SIZES = (32, 64, 128)  # the MLP's search
RESNET_BATCH_SIZE = 128  # ResNet-18's batch (conf/train_resnet.yaml)


def _env() -> dict[str, str]:
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


class DeviceMemoryPeak:
    """Polls ``nvidia-smi`` in a thread: the peak memory in use on the first visible GPU above what was in use at
    the start (MiB).

    Counts every process on the device (CUDA contexts included), so K concurrent workers are measured together.
    Inactive (``peak_mib`` stays None) where ``enabled`` is false or ``nvidia-smi`` is missing.
    """

    def __init__(self, enabled: bool, interval_s: float = 0.25) -> None:
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        self.interval_s = interval_s
        self.peak_mib: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _used_mib() -> float:
        device = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]  # an index or a UUID
        query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", f"--id={device}"]
        return float(subprocess.run(query, capture_output=True, text=True, check=True).stdout.split()[0])

    def __enter__(self) -> DeviceMemoryPeak:
        if self.enabled:
            baseline = self._used_mib()
            self.peak_mib = 0.0

            def poll() -> None:
                while not self._stop.wait(self.interval_s):
                    self.peak_mib = max(self.peak_mib or 0.0, self._used_mib() - baseline)

            self._thread = threading.Thread(target=poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def timed(commands: list[list[str]], logs: list[Path], accelerator: str = "cpu") -> tuple[float, float | None]:
    """Start ``commands`` together from the repository root; return the wall time until the last exits (s) and,
    on a GPU, the peak device memory in use meanwhile (MiB)."""
    with DeviceMemoryPeak(accelerator == "gpu") as memory:
        start = time.perf_counter()
        outs = [log.open("w") for log in logs]
        procs = [
            subprocess.Popen(command, cwd=REPO, env=_env(), stdout=out, stderr=subprocess.STDOUT)
            for command, out in zip(commands, outs, strict=True)
        ]
        codes = [proc.wait() for proc in procs]
        elapsed = time.perf_counter() - start
        for out in outs:
            out.close()
    for command, code, log in zip(commands, codes, logs, strict=True):
        if code != 0:
            raise SystemExit(f"{' '.join(command)} failed (exit {code}); see {log}")
    return elapsed, memory.peak_mib


def import_seconds(repeats: int, workdir: Path) -> list[float]:
    """Wall times of ``python -c 'import torch, lightning'`` (the import every method pays)."""
    command = [sys.executable, "-c", "import torch, lightning"]
    return [timed([command], [workdir / "import.log"])[0] for _ in range(repeats)]


# -- lightning_hydro ---------------------------------------------------------------------------------------


def run_lightning_hydro(sampler: str, seed: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    sweep_dir = workdir / f"lh-{sampler}-{seed}"
    task = ["--config-name", "train_resnet", f"model.width={args.width}"] if args.task == "resnet18" else []
    command = [
        sys.executable,
        "examples/train.py",
        "-m",
        *task,
        f"hydra.sweep.dir={sweep_dir}",
        f"hydra.sweeper.sampler={sampler}",
        f"hydra.sweeper.seed={seed}",
        f"hydra.sweeper.n_trials={args.n_trials}",
        f"trainer.max_epochs={args.epochs}",
        f"trainer.accelerator={args.accelerator}",
        "hydra.sweeper.plots=false",
    ]
    seconds, memory = timed([command], [workdir / f"lh-{sampler}-{seed}.log"], args.accelerator)
    trials = json.loads((sweep_dir / "results.json").read_text())["trials"]
    full = [t["metrics"]["val_acc"] for t in trials if t["budget"] >= args.epochs]
    return {
        "seconds": seconds,
        "trials": len(trials),
        "trial_epochs": sum(t["budget"] for t in trials),
        "best_val_acc": max(full) if full else None,
        "gpu_mib": memory,
    }


# -- the task, as Optuna's and Ray's trials build it ----------------------------------------------------------


def build_trial(task: str, width: int, params: dict[str, Any]) -> tuple[Any, Any]:
    """The (LightningModule, LightningDataModule) of one trial, as conf/train.yaml / train_resnet.yaml build it."""
    from lightning_hydro.demos import Digits32DataModule, DigitsDataModule, DigitsMLP, DigitsResNet

    if task == "resnet18":
        model = DigitsResNet(
            width=width, lr=params["lr"], momentum=params["momentum"], weight_decay=params["weight_decay"]
        )
        return model, Digits32DataModule(batch_size=RESNET_BATCH_SIZE)
    model = DigitsMLP(hidden_dim=64, depth=2, lr=params["lr"], momentum=params["momentum"], optimizer="sgd")
    return model, DigitsDataModule(batch_size=params["batch_size"])


def suggest_params(task: str, trial: Any) -> dict[str, Any]:
    """One trial's configuration, drawn by Optuna from the space of ``task`` (the sweeper's ``params``)."""
    params: dict[str, Any] = {"lr": trial.suggest_float("lr", 1e-3, 1.0, log=True)}
    params["momentum"] = trial.suggest_float("momentum", 0.0, 0.99)
    if task == "resnet18":
        params["weight_decay"] = trial.suggest_float("weight_decay", 1e-5, 1e-2, log=True)
    else:
        params["batch_size"] = trial.suggest_categorical("batch_size", BATCH_SIZES)
    return params


# -- Optuna and Ray Tune: run in child processes (``--child``), so that each is timed as a whole command -------


def child_optuna(method: str, args: argparse.Namespace) -> dict[str, Any]:
    """One Optuna worker: optimize the shared study until ``args.n_trials`` trials exist; report its own trials."""
    import lightning as L
    import optuna
    import torch
    from optuna_integration import PyTorchLightningPruningCallback

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.workers > 1:  # K processes share the threads one process would have (OMP_NUM_THREADS or the cores)
        torch.set_num_threads(max(1, torch.get_num_threads() // args.workers))
    sampler_seed = args.seed + 1000 * args.worker  # K workers seeded alike would draw the same first trials
    sampler = (
        optuna.samplers.RandomSampler(seed=sampler_seed)
        if "random" in method
        else optuna.samplers.TPESampler(seed=sampler_seed)
    )
    pruner: optuna.pruners.BasePruner = optuna.pruners.NopPruner()
    if method.endswith("-sh"):
        pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    storage = None
    if args.storage is not None:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        storage = JournalStorage(JournalFileBackend(str(args.storage)))
    study = optuna.create_study(
        study_name="sweep", storage=storage, load_if_exists=True, direction="maximize", sampler=sampler, pruner=pruner
    )
    epochs_trained: list[int] = []
    values: list[float] = []

    def objective(trial: optuna.Trial) -> float:
        params = suggest_params(args.task, trial)
        L.seed_everything(0, verbose=False)  # as conf/train.yaml's seed: 0 seeds every lightning_hydro trial
        model, data = build_trial(args.task, args.width, params)
        callbacks = [PyTorchLightningPruningCallback(trial, monitor="val_acc")] if method.endswith("-sh") else []
        trainer = L.Trainer(**_trainer_kwargs(args.epochs, args.accelerator), callbacks=callbacks)
        try:
            trainer.fit(model, datamodule=data)
        except optuna.TrialPruned:
            epochs_trained.append(int(trainer.current_epoch) + 1)  # pruned at the end of that epoch's validation
            raise
        epochs_trained.append(int(trainer.current_epoch))
        values.append(float(trainer.callback_metrics["val_acc"]))
        return values[-1]

    # n_trials in total over all workers: each stops once the study holds that many (running ones included)
    stop = optuna.study.MaxTrialsCallback(args.n_trials, states=None)
    study.optimize(objective, n_trials=args.n_trials, callbacks=[stop])
    memory = torch.cuda.max_memory_reserved() / 2**20 if torch.cuda.is_available() else None
    return {
        "trials": len(epochs_trained),
        "trial_epochs": sum(epochs_trained),
        "best_val_acc": max(values) if values else None,
        "torch_reserved_mib": memory,
    }


def child_ray(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    task, width, epochs = args.task, args.width, args.epochs

    def trainable(config: dict[str, Any]) -> None:
        import lightning as L

        class Report(L.Callback):
            def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
                if not trainer.sanity_checking:
                    tune.report({"val_acc": float(trainer.callback_metrics["val_acc"])})

        L.seed_everything(0, verbose=False)
        model, data = build_trial(task, width, config)
        trainer = L.Trainer(**_trainer_kwargs(epochs, "cpu"), callbacks=[Report()])
        trainer.fit(model, datamodule=data)

    space: dict[str, Any] = {"lr": tune.loguniform(1e-3, 1.0), "momentum": tune.uniform(0.0, 0.99)}
    if task == "resnet18":
        space["weight_decay"] = tune.loguniform(1e-5, 1e-2)
    else:
        space["batch_size"] = tune.choice(list(BATCH_SIZES))
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(
            metric="val_acc",
            mode="max",
            num_samples=args.n_trials,
            scheduler=ASHAScheduler(max_t=epochs, grace_period=1, reduction_factor=3),
            search_alg=tune.search.BasicVariantGenerator(random_state=args.seed),
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


def _trainer_kwargs(epochs: int, accelerator: str) -> dict[str, Any]:
    return {
        "max_epochs": epochs,
        "accelerator": accelerator,
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "log_every_n_steps": 10,
    }


def run_child(method: str, workers: int, seed: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Run ``method`` as ``workers`` child processes started together (Ray: one); combine their reports."""
    tag = f"{method}-k{workers}-{seed}"
    storage = ["--storage", str(workdir / f"{tag}.journal")] if workers > 1 else []
    common = [sys.executable, __file__, "--child", method, "--seed", str(seed), "--task", args.task]
    common += ["--width", str(args.width), "--accelerator", args.accelerator, "--n-trials", str(args.n_trials)]
    common += ["--epochs", str(args.epochs), "--workers", str(workers), *storage]
    outs = [workdir / f"{tag}-w{worker}.json" for worker in range(workers)]
    commands = [[*common, "--worker", str(worker), "--output", str(out)] for worker, out in enumerate(outs)]
    logs = [out.with_suffix(".log") for out in outs]
    seconds, memory = timed(commands, logs, args.accelerator)
    parts = [json.loads(out.read_text()) for out in outs]
    bests = [p["best_val_acc"] for p in parts if p["best_val_acc"] is not None]
    return {
        "seconds": seconds,
        "trials": sum(p["trials"] for p in parts),
        "trial_epochs": sum(p["trial_epochs"] for p in parts),
        "best_val_acc": max(bests) if bests else None,
        "gpu_mib": memory,
    }


# -- the report ---------------------------------------------------------------------------------------------


def _summary(by_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    bests = [r["best_val_acc"] for r in by_seed.values()]
    known = [b for b in bests if b is not None]
    memory = [r["gpu_mib"] for r in by_seed.values() if r.get("gpu_mib") is not None]
    return {
        "wall": statistics.median(r["seconds"] for r in by_seed.values()),
        "bests": bests,
        "mean": statistics.mean(known) if known else None,
        "trials": statistics.mean(r["trials"] for r in by_seed.values()),
        "epochs": statistics.mean(r["trial_epochs"] for r in by_seed.values()),
        "gpu_mib": statistics.median(memory) if memory else None,
    }


def speed_ratios(summaries: dict[str, dict[str, Any]], row: str) -> tuple[str, str]:
    """``row``'s speed-up over the fastest Optuna row, and over the fastest Optuna row whose mean best accuracy
    ``row`` equals or beats (the issue's measure), as table cells."""
    mine = summaries[row]
    optuna_rows = {name: s for name, s in summaries.items() if name.startswith("optuna")}
    if not optuna_rows:
        return "-", "-"
    fastest = min(optuna_rows, key=lambda name: optuna_rows[name]["wall"])
    overall = f"{optuna_rows[fastest]['wall'] / mine['wall']:.2f}x ({fastest})"
    matched = {
        name: s
        for name, s in optuna_rows.items()
        if mine["mean"] is not None and s["mean"] is not None and mine["mean"] >= s["mean"]
    }
    if not matched:
        return overall, "none: every Optuna row was more accurate"
    fastest_matched = min(matched, key=lambda name: matched[name]["wall"])
    return overall, f"{matched[fastest_matched]['wall'] / mine['wall']:.2f}x ({fastest_matched})"


def report(runs: dict[str, dict[int, dict[str, Any]]], imports: list[float], settings: dict[str, Any]) -> str:
    common = statistics.median(imports)
    task = "digits MLP" if settings["task"] == "mlp" else f"ResNet-18 (width {settings['width']}), 32x32 digits"
    lines = [
        f"# Sweep vs peers: {task}, {settings['n_trials']} trials, {settings['epochs']} epochs, "
        f"seeds {settings['seeds']}, on {settings['accelerator']}",
        "",
        f"Command: `python benchmarks/sweep_vs_peers.py {settings['argv']}`",
        "",
        f"Common import (`import torch, lightning`, median of {len(imports)} fresh processes): {common:.1f} s",
        "",
        "| method | seeds | wall s (median) | after import s | trials (mean) | trial-epochs (mean) "
        "| best val_acc per seed | mean | GPU MiB (peak, median) | vs fastest Optuna row "
        "| vs fastest Optuna row it matches in accuracy |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---|---|",
    ]
    summaries = {method: _summary(by_seed) for method, by_seed in runs.items() if by_seed}
    for method, s in summaries.items():
        best_text = " / ".join("-" if b is None else f"{b:.4f}" for b in s["bests"])
        mean = "-" if s["mean"] is None else f"{s['mean']:.4f}"
        memory = "-" if s["gpu_mib"] is None else f"{s['gpu_mib']:.0f}"
        overall, matched = speed_ratios(summaries, method) if method.startswith("lh-") else ("", "")
        seeds = ", ".join(str(seed) for seed in runs[method])
        lines.append(
            f"| {method} | {seeds} | {s['wall']:.1f} | {s['wall'] - common:.1f} | {s['trials']:.0f} | "
            f"{s['epochs']:.0f} | {best_text} | {mean} | {memory} | {overall} | {matched} |"
        )
    return "\n".join(lines) + "\n"


def row_name(method: str, workers: int) -> str:
    """The report's name of a method run by ``workers`` processes (Optuna rows name their K)."""
    return f"{method} K={workers}" if method.startswith("optuna") else method


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=TASKS, default="mlp")
    parser.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--width", type=int, help="ResNet-18's first-stage width (default 64; --quick: 8)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1], help="Optuna worker processes, K per row")
    parser.add_argument("--threads", type=int, help="torch threads per command (OMP_NUM_THREADS); default: torch's")
    parser.add_argument("--n-trials", type=int, help="default 32 (--quick: 4)")
    parser.add_argument("--epochs", type=int, help="default 9 (--quick: 2)")
    parser.add_argument("--seeds", type=int, nargs="+", help="default 0 1 2 (--quick: 0)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--import-repeats", type=int, help="default 3 (--quick: 1)")
    parser.add_argument("--quick", action="store_true", help="4 trials of 2 epochs, seed 0: checks the plumbing")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "sweep_vs_peers.md")
    parser.add_argument("--from-json", type=Path, help="rewrite the report of an earlier run's .json (no training)")
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--storage", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if any(k < 1 for k in args.workers):
        parser.error(f"--workers: each K must be >= 1, got {args.workers}")
    quick = {"n_trials": 4, "epochs": 2, "seeds": [0], "import_repeats": 1, "width": 8}
    full = {"n_trials": 32, "epochs": 9, "seeds": [0, 1, 2], "import_repeats": 3, "width": 64}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:  # what the command line names wins over --quick
            setattr(args, key, value)
    if args.child:
        if args.child == "ray-asha":
            result = child_ray(args)
        else:
            args.workers = args.workers[0]
            result = child_optuna(args.child, args)
        args.output.write_text(json.dumps(result))
        return
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        runs = {m: {int(seed): r for seed, r in by_seed.items()} for m, by_seed in saved["runs"].items() if by_seed}
        print(report(runs, saved["imports"], saved.get("settings") or _settings(args)))
        return
    if args.threads is not None:  # inherited by every command this process starts (it imports no torch itself)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.accelerator == "gpu" and "ray-asha" in args.methods:
        parser.error("ray-asha runs on the CPU in this benchmark: leave it out of --methods with --accelerator gpu")
    methods = [m for m in args.methods if m != "ray-asha" or _has("ray")]
    rows = [(m, k) for m in methods for k in (args.workers if m.startswith("optuna") else [1])]
    workdir = Path(tempfile.mkdtemp(prefix="sweep_vs_peers_"))
    imports = import_seconds(args.import_repeats, workdir)
    runs: dict[str, dict[int, dict[str, Any]]] = {row_name(m, k): {} for m, k in rows}
    for seed in args.seeds:  # interleaved: seed 0 of every method, then seed 1, ...
        for method, workers in rows:
            name = row_name(method, workers)
            if method.startswith("lh-"):
                runs[name][seed] = run_lightning_hydro(method[3:], seed, args, workdir)
            else:
                runs[name][seed] = run_child(method, workers, seed, args, workdir)
            print(name, seed, runs[name][seed], flush=True)
            write_report({m: r for m, r in runs.items() if r}, imports, args)  # after every run: partial results
    print(write_report(runs, imports, args))


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("task", "accelerator", "width", "workers", "threads", "n_trials", "epochs", "seeds")
    return {**{key: getattr(args, key) for key in keys}, "argv": " ".join(sys.argv[1:])}


def write_report(runs: dict[str, dict[int, dict[str, Any]]], imports: list[float], args: argparse.Namespace) -> str:
    """Write the report of the runs done so far (markdown and JSON); return the markdown."""
    settings = _settings(args)
    text = report(runs, imports, settings)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    saved = {"settings": settings, "imports": imports, "runs": runs}
    args.output.with_suffix(".json").write_text(json.dumps(saved, indent=1))
    return text


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
