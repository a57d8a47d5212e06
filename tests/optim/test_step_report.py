"""TrialGroupOptimizer.step takes the rows to skip and returns its report; a skipped row keeps its weights."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from lightning_hydro.demos import DigitsMLP
from lightning_hydro.fused.step.select_update import select_fused_update
from lightning_hydro.optim.group_optimizer import TrialGroupOptimizer
from lightning_hydro.optim.optimizer_config import parse_optimizer_config
from lightning_hydro.stacking.stacked_state import StackedState


class Skip:
    def __init__(self, mask: list[bool]) -> None:
        self.mask = torch.tensor(mask)

    def rows_to_skip(self, trial_ids: list[int]) -> Tensor:
        return self.mask

    def reads_each_step(self, device: torch.device) -> bool:
        return self.on_host

    on_host = False


@pytest.mark.parametrize("on_host", [False, True])
@pytest.mark.parametrize("path", ["fused", "universal"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_skipped_rows_are_untouched_and_the_others_step_as_without_a_skip(path, optimizer, on_host):
    def build() -> tuple[StackedState, TrialGroupOptimizer]:
        torch.manual_seed(0)
        trials = [DigitsMLP(hidden_dim=8, lr=0.1, optimizer=optimizer) for _ in range(3)]
        group = StackedState(nn.Module(), trials, [0, 1, 2])
        opts = {t: parse_optimizer_config(m.configure_optimizers(), trial_id=t, module=m) for t, m in enumerate(trials)}
        return group, TrialGroupOptimizer(group, opts, path=path, fast_path=select_fused_update)

    reports = []
    finals = []
    for skip in ([False, False, False], [False, True, False]):
        group, opt = build()
        torch.manual_seed(1)
        # read on the host, a skipped row leaves the group after the step (SGD would otherwise keep stepping every
        # row with torch's first-momentum-step formula while that row has no buffer): one step; masked: three
        for _ in range(1 if on_host else 3):
            for param in group.params.values():
                param.grad = torch.randn_like(param)
            group.params["head.weight"].grad[2, 0, 0] = float("nan") if skip[1] else 1.0  # row 2: bad gradient
            before = {k: p.detach().clone() for k, p in group.params.items()}
            rows = Skip(skip)
            rows.on_host = on_host
            reports.append(opt.step(skip=rows))
        finals.append({k: p.detach().clone() for k, p in group.params.items()})
        for name, param in group.params.items():  # the last step left the skipped rows as they were
            for row in (1, 2) if skip[1] else ():
                assert torch.equal(param[row], before[name][row])
    report = reports[-1]
    assert report.trial_ids == (0, 1, 2)
    assert report.read() == ([0], {1: "non-finite loss", 2: "non-finite gradients"})
    for name in finals[0]:  # row 0 bitwise as in the run without skips
        assert torch.equal(finals[0][name][0], finals[1][name][0])


def test_a_step_without_gradients_updates_nothing_and_reports_none():
    trials = [DigitsMLP(hidden_dim=8) for _ in range(2)]
    group = StackedState(nn.Module(), trials, [0, 1])
    opts = {t: parse_optimizer_config(m.configure_optimizers(), trial_id=t, module=m) for t, m in enumerate(trials)}
    assert TrialGroupOptimizer(group, opts).step() is None


@pytest.mark.parametrize("path", ["fused", "universal"])
def test_large_finite_float16_gradients_step_every_row(path):
    # each row's gradients sum past float16's 65504 (3000 in every element): finite, so no row is skipped
    trials = [DigitsMLP(hidden_dim=8, lr=1e-4).half() for _ in range(2)]
    group = StackedState(nn.Module(), trials, [0, 1])
    opts = {t: parse_optimizer_config(m.configure_optimizers(), trial_id=t, module=m) for t, m in enumerate(trials)}
    opt = TrialGroupOptimizer(group, opts, path=path, fast_path=select_fused_update)
    for param in group.params.values():
        param.grad = torch.full_like(param, 3000.0)
    before = {k: p.detach().clone() for k, p in group.params.items()}
    report = opt.step()
    assert report is not None
    assert report.read() == ([0, 1], {})
    assert all(not torch.equal(p, before[k]) for k, p in group.params.items())  # every row stepped
