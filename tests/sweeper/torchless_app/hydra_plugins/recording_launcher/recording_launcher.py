"""A Hydra launcher that answers each group job of a ``lightning_hydro`` sweep from its spec, in this process.

It writes the ``group_result.json`` a job would (every trial completed, ``val_loss`` a function of its
overrides; a probe group's ``fusion_limit``) and runs no task function, so that a sweep run through it loads
only what the sweeper's own process needs. An app selects it with ``hydra.launcher._target_``.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

PROBED_LIMIT = 3


class RecordingLauncher(Launcher):
    """Writes each launched group's result as its job would; see the module docstring."""

    def __init__(self, **_: Any) -> None:
        self.config: DictConfig | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config

    def launch(self, job_overrides: Any, initial_job_idx: int) -> list[JobReturn]:
        assert self.config is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        returns = []
        for overrides in job_overrides:
            group_id = next(o.split("=", 1)[1] for o in overrides if o.startswith("hydra.sweep.subdir="))
            spec = json.loads((sweep_dir / "lightning_hydro" / "groups" / f"{group_id}.json").read_text())
            job_dir = sweep_dir / group_id
            job_dir.mkdir(parents=True, exist_ok=True)
            if spec["kind"] == "probe":
                result: dict[str, Any] = {"group_id": group_id, "fusion_limit": PROBED_LIMIT}
            else:
                result = {"group_id": group_id, "trials": {str(t["trial_id"]): _trial(t) for t in spec["trials"]}}
            (job_dir / "group_result.json").write_text(json.dumps(result))
            returns.append(JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED, _return_value=None))
        return returns


def _trial(trial: dict[str, Any]) -> dict[str, Any]:
    loss = zlib.crc32(" ".join(trial["overrides"]).encode()) / 2**32
    return {
        "status": "completed",
        "budget": 1,
        "metrics": {"val_loss": loss},
        "history": [{"epoch": 0, "val_loss": loss}],
        "seed": trial["seed"],
    }
