"""Where the README's sweep spends its wall time: a sampled profile of ``examples/train.py -m``, by phase.

Runs the sweep of ``sweep_vs_peers.py`` (``lh-tpe``: 32 trials, 9 epochs, seed 0, plots off) under the
sampling profiler py-spy (``pip install py-spy``; it samples the process from outside, so the sweep runs at
nearly full speed), then sorts every sample into one phase by the frames on its stack: imports, Hydra's
config composition, the fused training step (split into the vmapped forward, the backward and the rest),
validation, data loading, the sampler's asks, Trainer set-up, and the rest. Samples without a Python frame
(interpreter start and shutdown) are counted apart. Shares "after the import" leave out imports and those.

    python benchmarks/sweep_profile.py                         # profile a fresh sweep, print the table
    python benchmarks/sweep_profile.py --raw profile.txt       # only classify an earlier py-spy raw file

Results: ``benchmarks/results/sweep_profile.md`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RATE = 200  # samples per second

# (phase, a frame that marks it); the first phase whose marker is on a sample's stack takes the sample
PHASES: tuple[tuple[str, str], ...] = (
    ("import", "_find_and_load"),
    ("Hydra config composition", "load_configuration"),
    ("sampler asks (TPE) and refills", "_refill_slots"),
    ("early-stopping decisions", "HalvingCallback._decide"),
    ("validation", "_EvaluationLoop.run"),
    ("step: the user's training_step for all trials (vmap)", "FusedLightningModule.training_step"),
    ("step: backward", "Strategy.backward"),
    ("step: the rest (optimizer update, clipping, hooks)", "optimizer_step ("),
    ("training data loading", "_DataFetcher"),
    ("epoch-end hooks", "on_train_epoch_end"),
    ("Trainer construction", "Trainer.__init__"),
    ("Trainer and fit set-up, teardown", "Trainer._run ("),
)
NO_FRAME = "no Python frame (interpreter start/exit)"
OTHER = "other"


def classify(raw: Path) -> collections.Counter[str]:
    """Samples per phase of a py-spy ``--format raw`` file (one ``frame;frame;... count`` per line)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        if not number.isdigit():
            continue
        if not stack.strip():
            counts[NO_FRAME] += int(number)
            continue
        phase = next((name for name, marker in PHASES if marker in stack), OTHER)
        counts[phase] += int(number)
    return counts


def table(counts: collections.Counter[str], command: str) -> str:
    total = sum(counts.values())
    after = total - counts["import"] - counts[NO_FRAME]
    lines = [
        "# Where the sweep's wall time goes (sampled profile)",
        "",
        f"Command: `{command}`",
        "",
        f"{total} samples at {RATE} per second ({total / RATE:.1f} s under the profiler); "
        f"after the import: {after} samples ({after / RATE:.1f} s).",
        "",
        "| phase | samples | s | share after the import |",
        "|---|---:|---:|---:|",
    ]
    for name in [*(p for p, _ in PHASES), OTHER, NO_FRAME]:
        n = counts.get(name, 0)
        share = "" if name in ("import", NO_FRAME) or not after else f"{100 * n / after:.0f}%"
        lines.append(f"| {name} | {n} | {n / RATE:.2f} | {share} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--raw", type=Path, help="classify this py-spy raw file instead of profiling a sweep")
    parser.add_argument("--n-trials", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=9)
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "sweep_profile.md")
    args = parser.parse_args()
    command = " ".join(["python", *sys.argv])
    raw = args.raw
    if raw is None:
        if shutil.which("py-spy") is None:
            raise SystemExit("sweep_profile.py needs py-spy on PATH: pip install py-spy")
        workdir = Path(tempfile.mkdtemp(prefix="sweep_profile_"))
        raw = workdir / "profile.txt"
        sweep = [
            sys.executable,
            "examples/train.py",
            "-m",
            f"hydra.sweep.dir={workdir / 'sweep'}",
            "hydra.sweeper.sampler=tpe",
            "hydra.sweeper.seed=0",
            f"hydra.sweeper.n_trials={args.n_trials}",
            f"trainer.max_epochs={args.epochs}",
            "hydra.sweeper.plots=false",
        ]
        profiler = ["py-spy", "record", "-r", str(RATE), "-f", "raw", "-o", str(raw), "--"]
        with (workdir / "sweep.log").open("w") as log:
            subprocess.run([*profiler, *sweep], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True)
    report = table(classify(raw), command)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
