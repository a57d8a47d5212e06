import pytest
import torch
from torch.optim import lr_scheduler

from lightning_hydro.scaling.multipliers import Multipliers
from lightning_hydro.scaling.param_groups import (
    find_optimizers,
    is_split,
    split_param_groups,
    split_scheduler,
)

MULT = {2: Multipliers(4.0, 0.25), 1: Multipliers(1.0, 1.0)}


def params():
    torch.manual_seed(0)
    return [
        torch.nn.Parameter(torch.randn(3, 3)),
        torch.nn.Parameter(torch.randn(3)),
        torch.nn.Parameter(torch.randn(2, 3)),
    ]


def mult_of(param):
    return MULT[param.dim()]


def presplit_groups(ps, lr, **extra):
    """The groups muP would have built up front: what splitting after the fact must reproduce."""
    return [
        {"params": [ps[0], ps[2]], "lr": lr * 4.0, **extra},
        {"params": [ps[1]], "lr": lr, **extra},
    ]


def lr_trajectory(optimizer, scheduler, steps, metric=None):
    history = []
    for step in range(steps):
        optimizer.step()
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric[step])
        history.extend(g["lr"] for g in optimizer.param_groups)
    return history


def test_split_keeps_settings_and_scales_lr_and_weight_decay():
    ps = params()
    opt = torch.optim.AdamW(ps, lr=0.1, weight_decay=0.01, betas=(0.8, 0.9))
    split = split_param_groups(opt, mult_of)
    assert split.num_old_groups == 1
    assert split.origin == (0, 0)
    assert [len(g["params"]) for g in opt.param_groups] == [2, 1]
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.4, 0.1])
    assert [g["weight_decay"] for g in opt.param_groups] == pytest.approx([0.0025, 0.01])
    assert all(g["betas"] == (0.8, 0.9) for g in opt.param_groups)
    assert is_split(opt)
    state = opt.state_dict()["param_groups"]
    assert [g["mup_lr_mult"] for g in state] == [4.0, 1.0]  # checkpoints keep the multipliers


def test_split_keeps_multiple_user_groups_apart():
    ps = params()
    opt = torch.optim.SGD([{"params": ps[:2], "lr": 0.1}, {"params": ps[2:], "lr": 0.5}], lr=1.0)
    split = split_param_groups(opt, mult_of)
    assert split.origin == (0, 0, 1)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.4, 0.1, 2.0])


def test_tensor_learning_rates_are_scaled():
    ps = params()
    opt = torch.optim.Adam(ps, lr=torch.tensor(0.1))
    split_param_groups(opt, mult_of)
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(0.4)


# Each builds a scheduler on an optimizer whose groups have the given lr multipliers: the reference is
# built on pre-split groups, where schedulers with per-group learning rates get per-group values.
SCHEDULERS = {
    "step": lambda opt, m: lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
    "multistep": lambda opt, m: lr_scheduler.MultiStepLR(opt, milestones=[2, 5], gamma=0.3),
    "exponential": lambda opt, m: lr_scheduler.ExponentialLR(opt, gamma=0.8),
    "constant": lambda opt, m: lr_scheduler.ConstantLR(opt, factor=0.25, total_iters=3),
    "warm_restarts": lambda opt, m: lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=3),
    "lambda": lambda opt, m: lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1)),
    "multiplicative": lambda opt, m: lr_scheduler.MultiplicativeLR(opt, lambda step: 0.9),
    "linear": lambda opt, m: lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=4),
    "cosine": lambda opt, m: lr_scheduler.CosineAnnealingLR(opt, T_max=5),
    "onecycle": lambda opt, m: lr_scheduler.OneCycleLR(opt, max_lr=[0.2 * x for x in m], total_steps=8),
    "cyclic": lambda opt, m: lr_scheduler.CyclicLR(
        opt, base_lr=[0.01 * x for x in m], max_lr=[0.1 * x for x in m], step_size_up=2
    ),
    "polynomial": lambda opt, m: lr_scheduler.PolynomialLR(opt, total_iters=5, power=2.0),
    "sequential": lambda opt, m: lr_scheduler.SequentialLR(
        opt,
        [lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=2), lr_scheduler.ExponentialLR(opt, 0.9)],
        milestones=[2],
    ),
    "chained": lambda opt, m: lr_scheduler.ChainedScheduler(
        [lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=2), lr_scheduler.ExponentialLR(opt, 0.9)]
    ),
}


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_split_schedulers_follow_the_presplit_trajectory(name):
    make = SCHEDULERS[name]
    ps = params()
    reference_opt = torch.optim.SGD(presplit_groups(ps, 0.1, momentum=0.9), lr=0.1, momentum=0.9)
    reference = lr_trajectory(reference_opt, make(reference_opt, [4.0, 1.0]), 8)

    ps = params()
    opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
    scheduler = make(opt, [1.0])  # built before the split, as inside configure_optimizers()
    split = split_param_groups(opt, mult_of)
    _, schedulers = find_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": scheduler}})
    for s in schedulers:
        split_scheduler(s, split)
    assert lr_trajectory(opt, scheduler, 8) == pytest.approx(reference)


def test_reduce_on_plateau_scales_its_floors():
    losses = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    ps = params()
    reference_opt = torch.optim.SGD(presplit_groups(ps, 0.1), lr=0.1)
    reference_sched = lr_scheduler.ReduceLROnPlateau(reference_opt, factor=0.1, patience=0, min_lr=[0.004, 0.001])
    reference = lr_trajectory(reference_opt, reference_sched, 8, losses)

    ps = params()
    opt = torch.optim.SGD(ps, lr=0.1)
    scheduler = lr_scheduler.ReduceLROnPlateau(opt, factor=0.1, patience=0, min_lr=0.001)
    split_scheduler(scheduler, split_param_groups(opt, mult_of))
    assert scheduler.min_lrs == pytest.approx([0.004, 0.001])
    assert lr_trajectory(opt, scheduler, 8, losses) == pytest.approx(reference)


def test_scheduler_state_dict_roundtrips_after_the_split():
    ps = params()
    opt = torch.optim.SGD(ps, lr=0.1)
    scheduler = lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    split_scheduler(scheduler, split_param_groups(opt, mult_of))
    opt.step()
    scheduler.step()
    state = scheduler.state_dict()
    assert state["base_lrs"] == pytest.approx([0.4, 0.1])


def test_a_single_absolute_floor_cannot_follow_split_groups():
    ps = params()
    opt = torch.optim.SGD(ps, lr=0.1)
    scheduler = lr_scheduler.CosineAnnealingLR(opt, T_max=5, eta_min=0.01)
    split = split_param_groups(opt, mult_of)
    with pytest.raises(ValueError, match=r"CosineAnnealingLR\(eta_min=0.01\) holds one absolute .* Use eta_min=0"):
        split_scheduler(scheduler, split)


def test_find_optimizers_reads_every_lightning_format():
    ps = params()
    a, b = torch.optim.SGD(ps[:1], lr=0.1), torch.optim.Adam(ps[1:], lr=0.1)
    sa = lr_scheduler.StepLR(a, 1)
    sb = lr_scheduler.ReduceLROnPlateau(b)
    formats = [
        ([a, b], [sa, sb]),
        [
            {"optimizer": a, "lr_scheduler": {"scheduler": sa, "interval": "step"}},
            {"optimizer": b, "lr_scheduler": sb},
        ],
        ((a, b), {"scheduler": sa}, sb),
    ]
    for config in formats:
        optimizers, schedulers = find_optimizers(config)
        assert optimizers == [a, b]
        assert schedulers == [sa, sb]
    assert find_optimizers(a) == ([a], [])
    assert find_optimizers(None) == ([], [])
