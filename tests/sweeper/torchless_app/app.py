"""A Hydra app whose sweep is planned by the ``lightning_hydro`` sweeper and run by :class:`RecordingLauncher`.

Run by ``tests/sweeper/test_sweeper_process.py`` in a subprocess: ``python app.py -m <overrides>``. The launcher
answers each group job from its spec without running the task function, so the process does only what the
sweeper's own process does; at exit it prints which of torch and Lightning were loaded.
"""

import atexit
import json
import sys

import hydra
from omegaconf import DictConfig

HEAVY = ("torch", "lightning", "torchmetrics")


def _report_loaded() -> None:
    print("LOADED " + json.dumps(sorted(name for name in HEAVY if name in sys.modules)))


atexit.register(_report_loaded)


@hydra.main(version_base="1.3", config_path=".", config_name="app")
def main(cfg: DictConfig) -> None:
    raise AssertionError("the recording launcher runs no task function")


if __name__ == "__main__":
    main()
