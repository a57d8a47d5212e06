"""Group jobs sharing one GPU plan for their share of its memory and count what other processes hold (GPU only)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from lightning_hydro.sweeper.planning.memory_probe import device_capacity_bytes

from .conftest import TINY, run_sweep

GIB = 2**30
HOLD = """
import sys, torch
block = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.gpu
def test_memory_another_process_holds_on_the_gpu_is_not_planned_for():
    total = torch.cuda.get_device_properties(0).total_memory
    alone = device_capacity_bytes("cuda:0")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(4 * GIB)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        shared = device_capacity_bytes("cuda:0")
        assert shared <= alone - 4 * GIB
        assert device_capacity_bytes("cuda:0", groups_per_device=2) <= min(total / 2, shared)
    finally:
        holder.communicate("", timeout=60)


@pytest.mark.gpu
def test_two_groups_on_one_gpu_each_probe_for_half_of_it(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    total = torch.cuda.get_device_properties(0).total_memory
    run_sweep(
        tmp_path,
        [
            *[a for a in TINY if not a.startswith("trainer.accelerator")],
            "trainer.accelerator=gpu",
            "hydra.sweeper.sampler=grid",
            "hydra.sweeper.params=null",
            "model.lr=0.1,0.2",
            "data.batch_size=32,64",  # two partitions: two probe jobs, then two groups
            "hydra.sweeper.fusion_limit=auto",
            "hydra.sweeper.devices_per_group=1",
            "hydra.sweeper.groups_per_device=2",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
        ],
    )
    probes = sorted((tmp_path).glob("probe_*/group_result.json"))
    assert len(probes) == 2
    for path in probes:
        result = json.loads(path.read_text())
        assert result["probe"]["capacity_bytes"] <= total / 2
    groups = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("group_*/group_result.json"))]
    assert [g["devices"] for g in groups] == ["0", "0"]  # both on the one GPU, at once
