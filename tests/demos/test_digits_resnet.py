"""ResNet-18 on the 32x32 digits: torchvision's layout, the data, fusion on every backend, and that it learns."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import (
    Digits32DataModule,
    DigitsResNet,
    ResNet18,
    load_digits_32,
    load_digits_tensors,
)
from tests.helpers import make_trainer, relative_difference


def test_the_network_has_torchvision_resnet18s_layout_with_a_3x3_stem():
    models = pytest.importorskip("torchvision.models")
    theirs = {k: v.shape for k, v in models.resnet18(num_classes=10).state_dict().items()}
    ours = {k: v.shape for k, v in ResNet18().state_dict().items()}
    assert list(ours) == list(theirs)  # same names, in the same order: loadable into torchvision's code paths
    differing = {k for k in ours if ours[k] != theirs[k]}
    assert differing == {"conv1.weight"}
    assert ours["conv1.weight"] == (64, 3, 3, 3)
    assert theirs["conv1.weight"] == (64, 3, 7, 7)


def test_width_scales_every_stage():
    net = ResNet18(width=8, in_channels=1)
    assert net.conv1.weight.shape == (8, 1, 3, 3)
    stages = (net.layer1, net.layer2, net.layer3, net.layer4)
    assert [stage[1].conv2.out_channels for stage in stages] == [8, 16, 32, 64]
    assert net.fc.in_features == 64
    assert net.layer1[0].downsample is None
    assert net.layer2[0].downsample is not None
    assert net(torch.zeros(2, 1, 32, 32)).shape == (2, 10)


def test_data_is_the_digits_split_upsampled_and_standardised():
    train, val = load_digits_32(channels=1)
    small_train, small_val = load_digits_tensors()
    assert train.tensors[0].shape == (1438, 1, 32, 32)
    assert val.tensors[0].shape == (359, 1, 32, 32)
    assert torch.equal(train.tensors[1], small_train.tensors[1])
    assert torch.equal(val.tensors[1], small_val.tensors[1])
    x = train.tensors[0]
    assert abs(float(x.mean())) < 1e-4
    assert abs(float(x.std()) - 1.0) < 1e-4
    upsampled = F.interpolate(small_train.tensors[0][:1].view(1, 1, 8, 8), size=(32, 32), mode="bilinear")
    assert torch.corrcoef(torch.stack([upsampled.flatten(), x[0].flatten()]))[0, 1] > 0.9999  # an affine map of it
    rgb, _ = load_digits_32(channels=3)
    assert rgb.tensors[0].shape == (1438, 3, 32, 32)
    assert torch.equal(rgb.tensors[0][:, 2], x[:, 0])


def test_datamodule_batches_in_a_seeded_order():
    def first_batch() -> torch.Tensor:
        dm = Digits32DataModule(batch_size=16, channels=3)
        dm.setup()
        x, y = next(iter(dm.train_dataloader()))
        assert x.shape == (16, 3, 32, 32)
        assert y.shape == (16,)
        return x

    torch.testing.assert_close(first_batch(), first_batch())


def test_arguments_are_checked():
    with pytest.raises(ValueError, match=r"load_digits_32: channels must be 1 or 3, got 2"):
        load_digits_32(channels=2)
    with pytest.raises(ValueError, match=r"Digits32DataModule: channels must be 1 or 3, got 4"):
        Digits32DataModule(channels=4)
    with pytest.raises(ValueError, match=r"Digits32DataModule: batch_size must be >= 1, got 0"):
        Digits32DataModule(batch_size=0)
    with pytest.raises(ValueError, match=r"ResNet18: width, in_channels and num_classes must be >= 1, got 0, 3 and 10"):
        ResNet18(width=0)
    with pytest.raises(ValueError, match=r"expected lr > 0, 0 <= momentum < 1 .* got lr=0.1, momentum=1.0"):
        DigitsResNet(lr=0.1, momentum=1.0)
    with pytest.raises(ValueError, match=r"nesterov=True needs momentum > 0"):
        DigitsResNet(momentum=0.0, nesterov=True)


def _fit_three_steps(module: L.LightningModule, accelerator: str) -> None:
    # float64: ResNet-18 amplifies float32 rounding step by step (docs/hfta.md), so a fusion error would hide
    trainer = make_trainer(max_steps=3, limit_val_batches=0, precision="64-true", accelerator=accelerator)
    torch.manual_seed(1234)
    trainer.fit(module, datamodule=Digits32DataModule(batch_size=16, channels=1))


@pytest.mark.parametrize("accelerator", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop"])
def test_fused_trials_train_to_the_weights_of_trials_trained_alone(backend, accelerator):
    trials = []
    for seed, (lr, momentum, weight_decay) in enumerate([(0.01, 0.9, 5e-4), (0.1, 0.5, 1e-4), (0.03, 0.0, 0.0)]):
        torch.manual_seed(seed)
        trials.append(DigitsResNet(width=4, in_channels=1, lr=lr, momentum=momentum, weight_decay=weight_decay))
    alone = [copy.deepcopy(m) for m in trials]
    for module in alone:
        _fit_three_steps(module, accelerator)
    fused = FusedLightningModule([copy.deepcopy(m) for m in trials], backend=backend, summary=False)
    _fit_three_steps(fused, accelerator)
    assert fused.backend == backend
    for tid, own in enumerate(alone):
        theirs, ours = own.state_dict(), fused.unfuse(tid).state_dict()
        assert ours.keys() == theirs.keys()
        initial = trials[tid].state_dict()
        moved = [k for k in theirs if not torch.equal(theirs[k], initial[k].to(theirs[k]))]
        assert len(moved) > 60  # every convolution, BatchNorm and the head changed: training really ran
        worst = max(relative_difference(ours[k], theirs[k]) for k in theirs if theirs[k].is_floating_point())
        exact = backend == "loop" and accelerator == "cpu"  # cuDNN may pick other algorithms run to run
        assert worst <= (0.0 if exact else 1e-10), (tid, worst)
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs if not theirs[k].is_floating_point())


def test_a_small_resnet_learns_the_digits_in_two_epochs():
    torch.manual_seed(0)
    model = DigitsResNet(width=8, in_channels=1, lr=0.05)
    trainer = make_trainer(max_epochs=2)
    trainer.fit(model, datamodule=Digits32DataModule(batch_size=64, channels=1))
    assert float(trainer.callback_metrics["val_acc"]) > 0.6  # chance: 0.1 (measured: 0.87)
