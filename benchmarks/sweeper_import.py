"""What Hydra's ``-m`` start pays for the sweeper: a fresh interpreter importing it as Hydra does, timed.

Each run starts ``python -c`` with one checkout importable, builds the plugin's Sweeper from the shim in
``hydra_plugins/`` (which imports ``lightning_hydro.sweeper._impl``), and exits; the wall time of the whole process
is taken, interpreter start included (``--bare`` times ``python -c pass`` alone, for reference). The runs of
several checkouts alternate, so that a busy machine slows them alike. Each row also says whether torch and
Lightning were loaded.

    python benchmarks/sweeper_import.py                          # this checkout, 9 runs
    python benchmarks/sweeper_import.py --repeats 9 --bare /path/to/an/older/checkout .
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

IMPORT = (
    "import sys\n"
    "from hydra_plugins.lightning_hydro_sweeper.lightning_hydro_sweeper import LightningHydroSweeper\n"
    "LightningHydroSweeper()\n"
    "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
)


def timed_run(code: str, checkout: Path) -> tuple[float, str]:
    """Seconds a fresh interpreter takes to run ``code`` with ``checkout`` importable, and what it printed."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code], cwd=checkout, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"sweeper_import: the import failed in {checkout}:\n{result.stderr}")
    return elapsed, result.stdout.strip()


def main() -> None:
    """Time each checkout given (default: this one) and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkouts", nargs="*", type=Path, default=[Path(__file__).resolve().parents[1]])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--bare", action="store_true", help="also time `python -c pass`")
    args = parser.parse_args()
    cases = [(str(c), IMPORT, c.resolve()) for c in args.checkouts]
    if args.bare:
        cases.append(("python -c pass", "print('-')", cases[0][2]))
    times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    loaded: dict[str, str] = {}
    timed_run(IMPORT, cases[0][2])  # warm-up: the file system cache
    for _ in range(args.repeats):
        for name, code, checkout in cases:
            elapsed, printed = timed_run(code, checkout)
            times[name].append(elapsed)
            loaded[name] = printed
    print(f"{'case':<50} {'median s':>9} {'min s':>7} {'max s':>7}  torch/lightning loaded")
    for name, values in times.items():
        print(f"{name:<50} {statistics.median(values):>9.3f} {min(values):>7.3f} {max(values):>7.3f}  {loaded[name]}")


if __name__ == "__main__":
    main()
