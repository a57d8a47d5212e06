"""The README sweep on two processes, two ways: each group fit by DDP over 2 ranks, or 2 groups at once.

Both run ``examples/train.py -m`` (conf/train.yaml and its digits search: random lr and momentum, ASHA, groups of at
most 16) on the CPU with the same ``--n-trials``. The batch size is searched over two values, so the sweep has two
groups (partitions), and both ways train the same global batches:

- ``ddp``: the basic launcher runs the two groups one after another, each fit by DDP over 2 processes
  (``+trainer.strategy=ddp trainer.devices=2``) at half the per-process batch size (16 or 32 per rank);
- ``parallel``: joblib runs the two groups at once, one process each
  (``hydra/launcher=joblib hydra.launcher.n_jobs=2``), at batch size 32 or 64.

Repeats alternate the two ways; each sweep is timed as a whole command (process start included). The report gives
the median wall time, the best ``val_acc`` and the trial-epochs trained. Results go to
``benchmarks/results/ddp_vs_groups.md`` and ``.json``.

    PYTHONPATH=. python benchmarks/ddp_vs_groups.py                 # 32 trials, 2 repeats
    PYTHONPATH=. python benchmarks/ddp_vs_groups.py --quick         # 4 trials of 2 epochs: checks the plumbing
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train.py"
OUT = REPO / "benchmarks" / "results"

WAYS = {
    "ddp": ["+trainer.strategy=ddp", "trainer.devices=2", "++hydra.sweeper.params.data.batch_size='choice(16, 32)'"],
    "parallel": [
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "trainer.devices=1",
        "++hydra.sweeper.params.data.batch_size='choice(32, 64)'",
    ],
}


def run_sweep(way: str, common: list[str], sweep_dir: Path) -> dict[str, Any]:
    """Run one sweep; return its wall time and what results.json says."""
    shutil.rmtree(sweep_dir, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    args = ["-m", *common, *WAYS[way], f"hydra.sweep.dir={sweep_dir}"]
    log = sweep_dir.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run([sys.executable, str(TRAIN), *args], cwd=REPO, env=env, stdout=out, stderr=out)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{way} sweep failed (exit {proc.returncode}); see {log}")
    trials = json.loads((sweep_dir / "results.json").read_text())["trials"]
    accs = [t["metrics"]["val_acc"] for t in trials if "val_acc" in t["metrics"]]
    groups = sorted({t["group"] for t in trials})
    return {
        "seconds": seconds,
        "best_val_acc": max(accs),
        "trial_epochs": sum(t["budget"] for t in trials),
        "trials": len(trials),
        "groups": len(groups),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-trials", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=None, help="trainer.max_epochs (default: conf/train.yaml)")
    parser.add_argument("--quick", action="store_true", help="4 trials of 2 epochs, one repeat")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lightning_hydro_ddp_vs_groups"))
    args = parser.parse_args()
    n_trials, epochs, repeats = (4, 2, 1) if args.quick else (args.n_trials, args.epochs, args.repeats)
    common = ["trainer.accelerator=cpu", f"hydra.sweeper.n_trials={n_trials}", "hydra.sweeper.plots=false"]
    if epochs is not None:
        common.append(f"trainer.max_epochs={epochs}")
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    for repeat in range(repeats):
        for way in WAYS if repeat % 2 == 0 else reversed(list(WAYS)):
            run = run_sweep(way, common, args.work / f"{way}_{repeat}")
            runs[way].append(run)
            print(f"repeat {repeat} {way}: {run}", flush=True)
    rows = {
        way: {
            "median_seconds": statistics.median(r["seconds"] for r in done),
            "seconds": [round(r["seconds"], 1) for r in done],
            "best_val_acc": [round(r["best_val_acc"], 4) for r in done],
            "trial_epochs": [r["trial_epochs"] for r in done],
            "groups": done[0]["groups"],
            "trials": done[0]["trials"],
        }
        for way, done in runs.items()
    }
    command = "PYTHONPATH=. python benchmarks/ddp_vs_groups.py " + " ".join(sys.argv[1:])
    device = f"CPU ({os.cpu_count()} cores, {platform.processor() or platform.machine()}), no GPU"
    report = {"command": command.strip(), "device": device, "date": date.today().isoformat(), "rows": rows}
    lines = [
        f"`{report['command']}` on {device}, {report['date']}; {n_trials} trials, {repeats} repeat(s), alternating.",
        "",
        "| way | groups | median wall time (s) | each run (s) | best val_acc | trial-epochs |",
        "|---|---|---|---|---|---|",
    ]
    for way, row in rows.items():
        lines.append(
            f"| {way} | {row['groups']} | {row['median_seconds']:.1f} | {row['seconds']} | {row['best_val_acc']} | "
            f"{row['trial_epochs']} |"
        )
    ratio = rows["ddp"]["median_seconds"] / rows["parallel"]["median_seconds"]
    lines += ["", f"DDP over 2 processes took {ratio:.2f}x the wall time of 2 groups in parallel."]
    OUT.mkdir(parents=True, exist_ok=True)
    name = "ddp_vs_groups_quick" if args.quick else "ddp_vs_groups"
    (OUT / f"{name}.json").write_text(json.dumps(report, indent=2))
    (OUT / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
