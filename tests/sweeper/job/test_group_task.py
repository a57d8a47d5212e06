"""Group jobs fail fast and say where: the task function's contract, tracebacks, and searches that fuse nothing.

Real sweeps of ``examples/train.py``'s config, in this process, with task functions of the tests' own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
import pytest
from omegaconf import DictConfig

from lightning_hydro.sweeper.group_spec import ERROR_FILE
from lightning_hydro.sweeper.job.group_model import GROUP_MODEL_TARGET

from ..conftest import TINY, run_sweep


def sweep_with(task_function: Callable[[DictConfig], Any], sweep_dir: Path, overrides: list[str]) -> Any:
    return run_sweep(sweep_dir, overrides, task_function)


FOUR_IN_TWO_JOBS = [*TINY, "hydra.sweeper.n_trials=4", "hydra.sweeper.fusion_limit=2"]
jobs_run: list[str] = []


def builds_its_own_model(cfg: DictConfig) -> None:
    """A task function that never instantiates cfg.model (so no group results can come)."""
    jobs_run.append(str(cfg.model._target_))


def test_a_task_function_without_group_results_stops_the_sweep_after_the_first_job(tmp_path):
    jobs_run.clear()
    with pytest.raises(RuntimeError, match=r"group_0000: the task function returned without training") as info:
        sweep_with(builds_its_own_model, tmp_path, FOUR_IN_TWO_JOBS)
    assert "hydra.utils.instantiate(cfg.model)" in str(info.value)
    assert "fit_from_config" in str(info.value)
    assert jobs_run == [GROUP_MODEL_TARGET]  # one job ran (seeing the rewritten node); the other never started
    assert not (tmp_path / "group_0001").exists()


def test_a_failing_job_leaves_its_traceback_in_its_directory_and_the_sweep_log(tmp_path, capfd):
    def fails(cfg: DictConfig) -> None:
        raise ValueError("model.depth must be even, got 'odd'")

    first_failed = r"first job failed, so no other job was launched \(group_0000: ValueError: model.depth must be even"
    with pytest.raises(RuntimeError, match=first_failed):
        sweep_with(fails, tmp_path, FOUR_IN_TWO_JOBS)
    assert not (tmp_path / "group_0001").exists()
    written = (tmp_path / "group_0000" / ERROR_FILE).read_text()
    assert "Traceback (most recent call last)" in written
    assert 'raise ValueError("model.depth must be even' in written  # the line that failed
    assert "lightning_hydro sweep group group_0000" in written
    assert "model.lr=" in written
    assert "config keys it may concern: model.depth" in written
    out, err = capfd.readouterr()  # Hydra's log handlers write to the console
    sweeper_lines = (out + err)[(out + err).index("lightning_hydro: job group_0000 failed") :]
    assert 'raise ValueError("model.depth must be even' in sweeper_lines


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_search_that_fuses_nothing_says_so_at_launch(tmp_path):
    # a continuous learning rate declared non-fusible: no two trials share a value
    overrides = [*TINY, "hydra.sweeper.n_trials=3", "hydra.sweeper.non_fusible=[data.batch_size,model.lr]"]
    # read from the sweeper's own logger, not from the console: where Hydra's console handler writes depends on
    # what earlier tests in this process did with the streams (pytest -n workers run them in other orders)
    logger, records = logging.getLogger("lightning_hydro.sweeper.planning.fusion_report"), _Records()
    logger.addHandler(records)
    try:
        with pytest.raises(RuntimeError):  # the task function trains nothing; the warning came before any job
            sweep_with(builds_its_own_model, tmp_path, overrides)
    finally:
        logger.removeHandler(records)
    warnings = [message for message in records.messages if "nothing fuses" in message]
    assert len(warnings) == 1
    assert "the 3 trials fall into 3 groups of one trial each" in warnings[0]
    assert "non-fusible keys model.lr, data.batch_size" in warnings[0]
    assert "separate, earlier stage" in warnings[0]
    assert "narrow their choices" in warnings[0]
    assert "muP surrogate" in warnings[0]


def builds_the_group(cfg: DictConfig) -> None:
    hydra.utils.instantiate(cfg.model)


def test_a_searched_key_that_changes_shapes_is_named_with_the_fix(tmp_path):
    # model.hidden_dim searched as fusible: the group's trials cannot be one model
    overrides = [*TINY, "hydra.sweeper.n_trials=2", "hydra.sweeper.non_fusible=[]", "hydra.sweeper.params=null"]
    overrides += ["hydra.sweeper.sampler=grid", "model.hidden_dim=choice(8, 16)"]
    with pytest.raises(
        RuntimeError,
        match=r"group_0000: .*ArchitectureMismatchError.*the trials of group group_0000 cannot train as one model",
    ):
        sweep_with(builds_the_group, tmp_path, overrides)
    written = (tmp_path / "group_0000" / ERROR_FILE).read_text()
    assert "the trials of group group_0000 cannot train as one model: they differ in model.hidden_dim" in written
    fix = "Fix: declare ['model.hidden_dim'] in hydra.sweeper.non_fusible (with hydra.sweeper.pad_widths=true"
    assert fix in written
    assert "they differ only in sizes ('body.0.bias' is [16] where trial 0 has [8]" in written


def test_a_searched_key_that_changes_more_than_sizes_is_not_told_of_padding(tmp_path):
    overrides = [*TINY, "hydra.sweeper.n_trials=2", "hydra.sweeper.non_fusible=[]", "hydra.sweeper.params=null"]
    overrides += ["hydra.sweeper.sampler=grid", "model.depth=choice(2, 3)"]
    with pytest.raises(RuntimeError, match=r"the trials of group group_0000 cannot train as one model"):
        sweep_with(builds_the_group, tmp_path, overrides)
    written = (tmp_path / "group_0000" / ERROR_FILE).read_text()
    assert "parameter 'body.4.weight' is extra" in written
    fix = "Fix: declare ['model.depth'] in hydra.sweeper.non_fusible (each value then gets groups of its own)"
    assert fix in written
    messages = [line for line in written.splitlines() if "ArchitectureMismatchError:" in line]
    assert messages
    assert not any("pad_widths" in line for line in messages)  # padding would not fuse them: not suggested


def test_a_job_dealt_a_gpu_trains_on_it(monkeypatch):
    import torch
    from omegaconf import OmegaConf

    from lightning_hydro.sweeper.job.group_task import _use_assigned_devices
    from lightning_hydro.sweeper.planning.device_plan import DEVICES_ENV

    cfg = OmegaConf.create({"trainer": {"accelerator": "auto", "devices": "auto"}})
    OmegaConf.set_struct(cfg, True)
    monkeypatch.setenv(DEVICES_ENV, "2")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # a faked 4-GPU node
    _use_assigned_devices(cfg, "group_0002")
    assert cfg.trainer.devices == [2]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # a job without GPUs keeps its trainer
    cpu = OmegaConf.create({"trainer": {"devices": 1}})
    _use_assigned_devices(cpu, "group_0002")
    assert cpu.trainer.devices == 1
