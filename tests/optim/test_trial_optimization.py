"""Every configure_optimizers() format Lightning documents is read per trial; the rest is refused clearly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_hydro.optim import OptimizerConfigError
from lightning_hydro.optim.optimizer_config import parse_optimizer_config

model = nn.Linear(3, 2)


def sgd() -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=0.1)


def test_formats():
    opt = sgd()
    assert parse_optimizer_config(opt, trial_id=0).optimizer is opt
    assert parse_optimizer_config([opt], trial_id=0).optimizer is opt
    step = torch.optim.lr_scheduler.StepLR(opt, 2)
    parsed = parse_optimizer_config(([opt], [step]), trial_id=0)
    assert parsed.schedulers[0].scheduler is step
    assert parsed.schedulers[0].interval == "epoch"
    parsed = parse_optimizer_config(
        {"optimizer": opt, "lr_scheduler": {"scheduler": step, "interval": "step", "frequency": 3, "name": "s"}},
        trial_id=0,
    )
    spec = parsed.schedulers[0]
    assert (spec.interval, spec.frequency, spec.name, spec.reduce_on_plateau) == ("step", 3, "s", False)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    parsed = parse_optimizer_config({"optimizer": opt, "lr_scheduler": plateau, "monitor": "val_loss"}, trial_id=0)
    assert parsed.schedulers[0].reduce_on_plateau
    assert parsed.schedulers[0].monitor == "val_loss"
    parsed = parse_optimizer_config([{"optimizer": opt, "lr_scheduler": step}], trial_id=0)
    assert parsed.schedulers[0].scheduler is step


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (None, r"Trial 4: configure_optimizers\(\) returned None"),
        ([], r"must return torch optimizers for a fused trial, got 0 \(none\)"),
        ("adam", r"returned str, which is not one of Lightning's formats"),
        ({"lr_scheduler": None}, r"needs an 'optimizer' key, got keys \['lr_scheduler'\]"),
    ],
)
def test_malformed_configs(config, message):
    with pytest.raises(OptimizerConfigError, match=message):
        parse_optimizer_config(config, trial_id=4)


def test_two_optimizers_need_manual_optimization():
    with pytest.raises(
        OptimizerConfigError,
        match=r"returned 2 optimizers \(SGD, SGD\) under automatic optimization, which steps exactly one\. Several "
        r"optimizers need manual optimization, as in Lightning itself: set self\.automatic_optimization = False",
    ):
        parse_optimizer_config([sgd(), sgd()], trial_id=1)


def test_manual_optimization_keeps_every_optimizer_and_its_schedulers_in_order():
    first, second = sgd(), sgd()
    step = torch.optim.lr_scheduler.StepLR(second, 2)
    parsed = parse_optimizer_config(([first, second], [step]), trial_id=0, manual=True)
    assert parsed.optimizer is first
    assert parsed.optimizers == [first, second]
    assert parsed.schedulers[0].scheduler is step
    stray = torch.optim.lr_scheduler.StepLR(sgd(), 2)
    with pytest.raises(OptimizerConfigError, match="attached to an optimizer that configure_optimizers"):
        parse_optimizer_config(([first, second], [stray]), trial_id=0, manual=True)


def test_scheduler_entries_are_checked():
    opt = sgd()
    step = torch.optim.lr_scheduler.StepLR(opt, 2)
    with pytest.raises(OptimizerConfigError, match="'interval' must be 'step' or 'epoch', got 'batch'"):
        parse_optimizer_config({"optimizer": opt, "lr_scheduler": {"scheduler": step, "interval": "batch"}}, trial_id=0)
    with pytest.raises(OptimizerConfigError, match=r"unsupported keys \['when'\]"):
        parse_optimizer_config({"optimizer": opt, "lr_scheduler": {"scheduler": step, "when": 1}}, trial_id=0)
    with pytest.raises(OptimizerConfigError, match="must have the key 'scheduler'"):
        parse_optimizer_config({"optimizer": opt, "lr_scheduler": {"interval": "step"}}, trial_id=0)
    with pytest.raises(OptimizerConfigError, match="ReduceLROnPlateau scheduler needs a metric to monitor"):
        parse_optimizer_config(([opt], [torch.optim.lr_scheduler.ReduceLROnPlateau(opt)]), trial_id=0)
    with pytest.raises(OptimizerConfigError, match="'frequency' must be >= 1, got 0"):
        parse_optimizer_config({"optimizer": opt, "lr_scheduler": {"scheduler": step, "frequency": 0}}, trial_id=0)


def test_foreign_parameters_are_refused():
    other = nn.Linear(3, 2)
    with pytest.raises(OptimizerConfigError, match=r"holds 2 parameter\(s\) that do not belong to the trial module"):
        parse_optimizer_config(torch.optim.SGD(other.parameters(), lr=0.1), trial_id=0, module=model)


def test_a_scheduler_of_another_optimizer_is_refused():
    opt, other = sgd(), torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(OptimizerConfigError, match="attached to an optimizer that configure_optimizers"):
        parse_optimizer_config(([opt], [torch.optim.lr_scheduler.StepLR(other, 2)]), trial_id=0)
