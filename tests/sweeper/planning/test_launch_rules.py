"""What a group job may ask of its launcher: GPUs dealt on this machine, DDP where it can run, refusals otherwise."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from lightning_hydro.sweeper.planning import launch_rules
from lightning_hydro.sweeper.planning.launch_rules import TrainerPlacement, check_launch, launcher_kind, plan_devices

GPUS = [str(i) for i in range(8)]  # a faked 8-GPU node


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        ("hydra._internal.core_plugins.basic_launcher.BasicLauncher", "basic"),
        ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "joblib"),
        ("hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher", "submitit_local"),
        ("hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher", "submitit_slurm"),
        ("hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher", "ray"),
        ("my_launchers.Cloud", "other"),
    ],
)
def test_launcher_kinds(target, kind):
    assert launcher_kind(target) == kind


@pytest.mark.parametrize(
    ("trainer", "gpus", "processes"),
    [
        ({"accelerator": "auto", "devices": "auto"}, 8, 8),
        ({"accelerator": "auto", "devices": -1}, 8, 8),
        ({"accelerator": "auto", "devices": "auto"}, 0, 1),
        ({"accelerator": "gpu", "devices": [0, 3]}, 8, 2),
        ({"accelerator": "gpu", "devices": "0,1,2"}, 8, 3),
        ({"accelerator": "cpu", "devices": 2, "strategy": "ddp"}, 0, 2),
        ({"accelerator": "gpu", "devices": "2"}, 8, 2),
        ({}, 4, 4),
    ],
)
def test_processes_per_job(trainer, gpus, processes):
    assert TrainerPlacement.from_config(trainer).processes(gpus) == processes


def test_an_instantiable_spawning_strategy_is_recognised():
    placement = TrainerPlacement.from_config(
        {"strategy": {"_target_": "lightning.pytorch.strategies.DDPStrategy", "start_method": "spawn"}}
    )
    assert placement.spawns
    ddp = {"strategy": {"_target_": "lightning.pytorch.strategies.DDPStrategy"}}
    assert not TrainerPlacement.from_config(ddp).spawns


def test_parallel_jobs_get_one_gpu_each_when_devices_is_auto_or_minus_one():
    for devices in ("auto", -1):
        placement = TrainerPlacement(devices=devices)
        plan = plan_devices("joblib", placement, GPUS, devices_per_group=None)
        assert plan is not None
        assert plan.blocks == tuple((i,) for i in range(8))  # not DDP over all eight in every job


def test_an_explicit_device_count_or_setting_sizes_the_blocks():
    plan = plan_devices("submitit_local", TrainerPlacement(devices=2), GPUS, devices_per_group=None)
    assert plan is not None
    assert plan.blocks[0] == (0, 1)
    plan = plan_devices("basic", TrainerPlacement(devices=1), GPUS, devices_per_group=4, groups_per_device=2)
    assert plan is not None
    assert (len(plan.blocks), plan.capacity) == (2, 4)


def test_no_plan_where_the_cluster_places_gpus_on_the_cpu_or_for_the_basic_launcher_by_default():
    placement = TrainerPlacement(devices=1)
    assert plan_devices("submitit_slurm", placement, GPUS, devices_per_group=1) is None
    assert plan_devices("ray", placement, GPUS, devices_per_group=1) is None
    assert plan_devices("joblib", TrainerPlacement(accelerator="cpu"), GPUS, devices_per_group=1) is None
    assert plan_devices("joblib", placement, [], devices_per_group=None) is None
    assert plan_devices("basic", TrainerPlacement(devices=2, strategy="ddp"), GPUS, devices_per_group=None) is None


def test_ddp_in_joblib_submitit_local_or_ray_workers_is_refused_with_the_remedy():
    for kind in ("joblib", "submitit_local", "ray"):
        with pytest.raises(ValueError, match=rf"DDP over 2 processes .* the {kind} launcher runs jobs in worker"):
            check_launch(kind, TrainerPlacement(devices=2, strategy="ddp"), gpus=8, processes=2)
    with pytest.raises(ValueError, match=r"hydra.sweeper.devices_per_group=1 and hydra/launcher=joblib"):
        check_launch("joblib", TrainerPlacement(devices=2), gpus=8, processes=2)
    check_launch("basic", TrainerPlacement(devices=2, strategy="ddp"), gpus=8, processes=2)  # the sweeper's command
    check_launch("joblib", TrainerPlacement(devices="auto"), gpus=8, processes=1)  # one GPU each (the plan)


def test_ddp_spawn_in_a_sweep_is_refused_and_slurm_needs_a_task_per_device():
    spawn = TrainerPlacement(devices=2, strategy="ddp_spawn")
    with pytest.raises(ValueError, match=r"trainer.strategy=ddp_spawn fits each group in processes it spawns.*ddp"):
        check_launch("basic", spawn, gpus=2, processes=2)
    ddp = TrainerPlacement(devices=4, strategy="ddp")
    with pytest.raises(ValueError, match=r"tasks_per_node=1: on SLURM each rank is a task .*tasks_per_node=4"):
        check_launch("submitit_slurm", ddp, gpus=0, processes=4, tasks_per_node=1)
    check_launch("submitit_slurm", ddp, gpus=0, processes=4, tasks_per_node=4)


def test_the_default_sweep_does_not_count_gpus(monkeypatch):
    # Counting them loads torch; with the basic launcher and no devices_per_group they change nothing.
    def no_count() -> list[str]:
        raise AssertionError("visible_gpus() was called")

    monkeypatch.setattr(launch_rules, "visible_gpus", no_count)
    config = launcher_config("hydra._internal.core_plugins.basic_launcher.BasicLauncher", {"accelerator": "auto"})
    assert launch_rules.plan_sweep_devices(config, devices_per_group=None, groups_per_device=1) is None


def launcher_config(target: str, trainer: dict[str, object], **launcher: object):
    return OmegaConf.create({"hydra": {"launcher": {"_target_": target, **launcher}}, "trainer": trainer})


TARGETS = {
    "basic": "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "joblib": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
    "submitit_local": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
    "submitit_slurm": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
    "ray": "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher",
    "other": "my_launchers.Cloud",
}
TRAINERS = [
    {"accelerator": accelerator, "devices": devices, "strategy": strategy}
    for accelerator in ("auto", "gpu", "cpu", "mps")
    for devices in ("auto", -1, 1, 2, [0, 1])
    for strategy in ("auto", "ddp", "ddp_spawn")
]


def outcome(config, devices_per_group, gpus, *, count_always, monkeypatch):
    """What plan_sweep_devices decides on a machine with ``gpus`` GPUs: the plan, or the refusal's text."""
    monkeypatch.setattr(launch_rules, "visible_gpus", lambda: list(gpus))
    if count_always:
        monkeypatch.setattr(launch_rules, "gpus_matter", lambda *args, **kwargs: True)
    try:
        return launch_rules.plan_sweep_devices(config, devices_per_group=devices_per_group, groups_per_device=2)
    except ValueError as err:
        return str(err)
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_not_counting_gpus_where_they_do_not_matter_changes_no_plan_and_no_refusal(kind, monkeypatch):
    skipped = 0
    for trainer in TRAINERS:
        for devices_per_group in (None, 1, 2):
            for tasks_per_node in (None, 2):
                config = launcher_config(TARGETS[kind], trainer, tasks_per_node=tasks_per_node)
                for gpus in ([], ["0"], [str(i) for i in range(8)]):
                    counted = outcome(config, devices_per_group, gpus, count_always=True, monkeypatch=monkeypatch)
                    planned = outcome(config, devices_per_group, gpus, count_always=False, monkeypatch=monkeypatch)
                    assert planned == counted, (kind, trainer, devices_per_group, tasks_per_node, gpus)
                placement = launch_rules.TrainerPlacement.from_config(trainer)
                skipped += not launch_rules.gpus_matter(kind, placement, devices_per_group=devices_per_group)
    assert skipped > 0  # the comparison covered cases where the count is skipped
