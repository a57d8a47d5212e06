"""A fused run checkpointed on the GPU restores, resumes and evaluates on the CPU (issue 20, item 5)."""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from tests.helpers import fit_digits, make_trainer, max_state_difference, seeded

pytestmark = pytest.mark.gpu

SHORT = dict(limit_train_batches=6, limit_val_batches=1)


def fused_trials() -> FusedLightningModule:
    configs = [(0.1, "sgd"), (3e-3, "adam"), (1e-2, "adamw")]
    trials = [
        seeded(lambda lr=lr, opt=opt: DigitsMLP(hidden_dim=16, lr=lr, optimizer=opt), [i])[0]
        for i, (lr, opt) in enumerate(configs)
    ]
    return FusedLightningModule(trials, backend="vmap", summary=False)


def test_a_gpu_checkpoint_restores_every_trial_bitwise_for_evaluation_on_the_cpu(tmp_path):
    on_gpu = fused_trials()
    trainer = make_trainer(max_epochs=1, accelerator="gpu", **SHORT)
    fit_digits(trainer, on_gpu)
    trainer.save_checkpoint(tmp_path / "gpu.ckpt")
    expected = {tid: {k: v.cpu() for k, v in on_gpu.unfuse(tid).state_dict().items()} for tid in on_gpu.trial_ids}

    restored = fused_trials()
    metrics = make_trainer(accelerator="cpu").validate(
        restored, datamodule=DigitsDataModule(batch_size=64), ckpt_path=tmp_path / "gpu.ckpt"
    )
    assert {f"val_acc/trial_{tid}" for tid in expected} <= set(metrics[0])
    for tid, state in expected.items():
        got = restored.unfuse(tid).state_dict()
        for name, value in state.items():
            assert got[name].device.type == "cpu"
            assert torch.equal(got[name], value), (tid, name)


def test_a_gpu_checkpoint_resumes_training_on_the_cpu(tmp_path):
    uninterrupted = fused_trials()
    fit_digits(make_trainer(max_epochs=4, accelerator="gpu", **SHORT), uninterrupted)

    first = fused_trials()
    trainer = make_trainer(max_epochs=2, accelerator="gpu", **SHORT)
    fit_digits(trainer, first)
    trainer.save_checkpoint(tmp_path / "gpu.ckpt")
    resumed = fused_trials()
    fit_digits(make_trainer(max_epochs=4, accelerator="cpu", **SHORT), resumed, ckpt_path=tmp_path / "gpu.ckpt")
    for tid in resumed.trial_ids:
        assert resumed.results[tid]["budget"] == 4
        assert resumed.results[tid]["steps"] == 24
        module = resumed.unfuse(tid)
        assert next(module.parameters()).device.type == "cpu"
        # the optimizer state came over too: two epochs on the CPU continue the GPU run (float32, TF32 off: the
        # two devices round differently, so not bitwise)
        assert max_state_difference(module, copy.deepcopy(uninterrupted.unfuse(tid)).cpu()) <= 1e-4, tid
