"""Bad input gets a clear error that says how to fix it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_hydro import ArchitectureMismatchError, FusedLightningModule
from lightning_hydro.backends import FusionError
from lightning_hydro.demos import DigitsMLP


def test_empty_list_is_rejected():
    with pytest.raises(ValueError, match="at least one trial module, got an empty list"):
        FusedLightningModule([])


def test_non_lightning_modules_are_rejected():
    with pytest.raises(TypeError, match=r"trial 1 is a Linear, expected a lightning.LightningModule"):
        FusedLightningModule([DigitsMLP(), nn.Linear(2, 2)])  # type: ignore[list-item]


def test_different_widths_are_refused_with_pad_widths_named_as_the_remedy():
    with pytest.raises(ArchitectureMismatchError) as refused:
        FusedLightningModule([DigitsMLP(hidden_dim=32), DigitsMLP(hidden_dim=16)])
    message = str(refused.value)
    assert message.startswith("Trial 1 cannot be fused with trial 0: they differ only in sizes (")
    # every differing size is named, the refused trial's against the reference's
    assert "'body.0.weight' is [16, 64] where trial 0 has [32, 64]" in message
    assert "'head.weight' is [10, 16] where trial 0 has [10, 32]" in message
    assert "pad_widths=True fuses them: FusedLightningModule(..., pad_widths=True) zero-pads" in message
    assert "in a sweep: hydra.sweeper.pad_widths=true" in message
    assert refused.value.differing_sizes["body.0.weight"] == ((16, 64), (32, 64))
    # and it is so: the same trials fuse with pad_widths=True
    fused = FusedLightningModule([DigitsMLP(hidden_dim=32), DigitsMLP(hidden_dim=16)], pad_widths=True)
    assert fused.trial_ids == [0, 1]


def test_a_trial_added_at_another_width_is_told_of_pad_widths():
    fused = FusedLightningModule([DigitsMLP(hidden_dim=8)], max_slots=2, summary=False)
    with pytest.raises(
        ArchitectureMismatchError,
        match=r"Trial 1 cannot be fused with the group: they differ only in sizes \('body.0.bias' is \[16\] where "
        r"the group has \[8\];.*pad_widths=True fuses them",
    ):
        fused.add_trial(DigitsMLP(hidden_dim=16))


def test_different_depths_name_missing_tensors():
    with pytest.raises(ArchitectureMismatchError, match=r"parameter 'body.4.weight' is extra") as refused:
        FusedLightningModule([DigitsMLP(depth=2), DigitsMLP(depth=3)])
    assert "pad_widths" not in str(refused.value)  # padding would not fuse them: not suggested
    assert refused.value.differing_sizes == {}


def test_different_dtypes_cannot_be_fused():
    with pytest.raises(
        ArchitectureMismatchError, match=r"torch.float64.*expected \[32, 64\] torch.float32.*separate groups"
    ) as refused:
        FusedLightningModule([DigitsMLP(hidden_dim=32), DigitsMLP(hidden_dim=32).double()])
    assert "pad_widths" not in str(refused.value)


def test_sizes_that_padding_would_change_are_refused_without_pad_widths():
    # a different number of classes differs only in sizes, but padding the output layer would change the loss:
    # the width plan refuses it, so pad_widths=True is not offered as the fix
    twelve_classes = DigitsMLP(hidden_dim=32)
    twelve_classes.head = nn.Linear(32, 12)
    with pytest.raises(
        ArchitectureMismatchError,
        match=r"parameter 'head.weight' is \[12, 32\] torch.float32 requires_grad=True, expected \[10, 32\] .*"
        r"Fused trials must share one architecture .* separate groups\.$",
    ) as refused:
        FusedLightningModule([DigitsMLP(hidden_dim=32), twelve_classes])
    assert "pad_widths" not in str(refused.value)


def test_same_object_twice_is_rejected():
    trial = DigitsMLP()
    with pytest.raises(ValueError, match="the same module object appears twice"):
        FusedLightningModule([trial, trial])


def test_trial_ids_must_be_distinct_and_one_per_trial():
    with pytest.raises(ValueError, match=r"trial_ids must be 2 distinct integers, one per trial, got \[3, 3\]"):
        FusedLightningModule([DigitsMLP(), DigitsMLP()], trial_ids=[3, 3])


def test_unknown_backend_lists_the_choices():
    with pytest.raises(ValueError, match="unknown backend 'jax'; expected one of 'auto', 'vmap', 'hfta', 'loop'"):
        FusedLightningModule([DigitsMLP()], backend="jax")  # type: ignore[arg-type]


def test_manual_optimization_on_vmap_is_refused_with_the_backend_to_use():
    trial = DigitsMLP()
    trial.automatic_optimization = False  # it runs on the loop: tests/fused/step/test_manual_steps.py
    with pytest.raises(FusionError, match=r"DigitsMLP uses manual optimization .* Use backend='loop', or backend="):
        FusedLightningModule([trial], backend="vmap")


def test_max_slots_below_trial_count_is_rejected():
    with pytest.raises(ValueError, match="max_slots=1 is less than the 2 trials given"):
        FusedLightningModule([DigitsMLP(), DigitsMLP()], max_slots=1)


def test_bad_mode_and_optimizer_path():
    with pytest.raises(ValueError, match="mode must be 'min' or 'max', got 'best'"):
        FusedLightningModule([DigitsMLP()], mode="best")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="optimizer_path must be 'auto', 'universal' or 'fused', got 'fast'"):
        FusedLightningModule([DigitsMLP()], optimizer_path="fast")  # type: ignore[arg-type]


def test_trial_parameters_are_views_of_the_stacked_state():
    trials = [DigitsMLP(hidden_dim=8) for _ in range(3)]
    fused = FusedLightningModule(trials, backend="vmap")
    stacked = fused.stacked.get_parameter("body__0__weight")
    assert stacked.shape == (3, 8, 64)
    with torch.no_grad():
        stacked[1].fill_(0.25)
    assert torch.all(trials[1].body[0].weight == 0.25)
    assert not torch.all(trials[0].body[0].weight == 0.25)
    assert fused.trial_ids == [0, 1, 2]
    # the trial modules are not submodules: the fused module's parameters are the stacked tensors only
    assert sum(p.numel() for p in fused.parameters()) == 3 * sum(p.numel() for p in trials[0].parameters())


def test_unfuse_returns_an_independent_copy():
    trials = [DigitsMLP(hidden_dim=8) for _ in range(2)]
    fused = FusedLightningModule(trials, backend="vmap")
    copy_ = fused.unfuse(1)
    assert isinstance(copy_, DigitsMLP)
    assert torch.equal(copy_.head.weight, trials[1].head.weight)
    with torch.no_grad():
        copy_.head.weight.zero_()
    assert not torch.equal(copy_.head.weight, trials[1].head.weight)
    with pytest.raises(KeyError, match=r"No trial 7; known trials: \[0, 1\]"):
        fused.unfuse(7)
