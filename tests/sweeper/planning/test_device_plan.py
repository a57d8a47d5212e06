"""One group per GPU: blocks of GPUs dealt to a sweep's jobs, with faked device counts (no GPU needed)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_hydro.sweeper.planning.device_plan import (
    DEVICES_ENV,
    DevicePlan,
    assigned_trainer_devices,
    device_env_override,
    visible_gpus,
)
from lightning_hydro.sweeper.planning.memory_probe import shared_capacity_bytes

GIB = 2**30


def test_eight_gpus_in_blocks_of_two_take_four_ddp_groups_at_a_time():
    plan = DevicePlan.for_devices([str(i) for i in range(8)], devices_per_group=2)
    assert plan.blocks == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert plan.capacity == 4
    assert plan.assign(5) == [(0, 1), (2, 3), (4, 5), (6, 7), (0, 1)]
    assert plan.batches(list("abcdefghij")) == [list("abcd"), list("efgh"), list("ij")]


def test_gpus_that_make_no_whole_block_stay_idle():
    plan = DevicePlan.for_devices(["0", "1", "2"], devices_per_group=2)
    assert (plan.blocks, plan.idle) == (((0, 1),), (2,))


@given(
    gpus=st.integers(1, 16),
    per_group=st.integers(1, 4),
    sharing=st.integers(1, 4),
    jobs=st.integers(0, 50),
)
def test_no_gpu_ever_runs_more_jobs_at_once_than_allowed(gpus, per_group, sharing, jobs):
    if per_group > gpus:
        return
    plan = DevicePlan.for_devices([str(i) for i in range(gpus)], devices_per_group=per_group, groups_per_device=sharing)
    launched = plan.batches(list(range(jobs)))
    assert [job for batch in launched for job in batch] == list(range(jobs))  # every job, in order, once
    for batch in launched:  # a batch runs at once; the next one starts after it
        on_gpu = Counter(gpu for block in plan.assign(len(batch)) for gpu in block)
        assert max(on_gpu.values(), default=0) <= sharing
        assert all(len(block) == per_group for block in plan.assign(len(batch)))


def test_settings_out_of_range_and_blocks_larger_than_the_machine_are_refused():
    with pytest.raises(ValueError, match=r"devices_per_group=4, but this machine shows 2 GPU\(s\)"):
        DevicePlan.for_devices(["0", "1"], devices_per_group=4)
    with pytest.raises(ValueError, match=r"must be >= 1, got 1 and 0"):
        DevicePlan.for_devices(["0"], devices_per_group=1, groups_per_device=0)


def test_visible_gpus_follow_cuda_visible_devices_else_the_cuda_count():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 5"}, count=lambda: 8) == ["2", "5"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, count=lambda: 8) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, count=lambda: 8) == []
    assert visible_gpus({}, count=lambda: 3) == ["0", "1", "2"]


def test_a_jobs_block_becomes_its_trainer_devices_where_it_sees_the_gpus():
    assert device_env_override((2, 3)) == f"++hydra.job.env_set.{DEVICES_ENV}='2,3'"
    assert assigned_trainer_devices({DEVICES_ENV: "2,3"}, gpus_in_job=4) == [2, 3]
    assert assigned_trainer_devices({DEVICES_ENV: "2,3"}, gpus_in_job=0) is None  # a CPU job keeps its trainer
    assert assigned_trainer_devices({}, gpus_in_job=4) is None
    with pytest.raises(RuntimeError, match=r"was given GPUs \[2, 3\] \(LIGHTNING_HYDRO_DEVICES\) but sees 2"):
        assigned_trainer_devices({DEVICES_ENV: "2,3"}, gpus_in_job=2)


def test_a_group_sharing_a_gpu_plans_for_its_share_and_what_others_leave_free():
    assert shared_capacity_bytes(80 * GIB, 80 * GIB, 0, groups_per_device=1) == 80 * GIB
    assert shared_capacity_bytes(80 * GIB, 80 * GIB, 0, groups_per_device=4) == 20 * GIB
    # another job holds 60 GiB of the device: this group may use what is free and what it holds itself
    assert shared_capacity_bytes(80 * GIB, 18 * GIB, 2 * GIB, groups_per_device=2) == 20 * GIB
