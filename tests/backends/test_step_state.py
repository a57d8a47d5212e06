"""The trials' Python state under the vectorised backends: what is tracked, how each trial gets its own, refusals."""

from __future__ import annotations

import types
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends import FusionError, make_backend
from lightning_hydro.backends.auto import choose_backend, clear_backend_cache
from lightning_hydro.backends.python_state import FRAMEWORK_KEYS, PythonState, trial_code_ran, user_keys
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.fused.verify.fusion import verify_fusion
from lightning_hydro.stacking.stacked_state import StackedState
from tests.helpers import fit_digits, make_trainer

BATCH = (torch.rand(8, 64), torch.randint(0, 10, (8,)))


def test_the_framework_keys_cover_what_torch_and_lightning_keep_on_a_module():
    module = DigitsMLP(hidden_dim=4)  # save_hyperparameters() adds _hparams and friends
    assert set(vars(nn.Module())) | set(vars(L.LightningModule())) | set(vars(module)) <= FRAMEWORK_KEYS
    assert user_keys(module) == []


class Keeper(DigitsMLP):
    """Keeps what its step computes in every way user code does."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(hidden_dim=8, **kwargs)
        self.calls = 0
        self.outputs: list[Any] = []
        self.by_name: dict[str, list[torch.Tensor]] = {}
        self.seen_list_type = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.calls += 1
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.seen_list_type = isinstance(self.outputs, list)
        self.outputs.append({"loss": loss.detach(), "preds": logits.argmax(-1), "step": self.calls})
        self.by_name.setdefault("loss", []).append(loss.detach())
        self.pair = (loss.detach(), len(self.outputs))
        return loss


def group_of(cls: type[nn.Module], count: int = 3, **kwargs: Any) -> StackedState:
    modules = []
    for seed in range(count):
        torch.manual_seed(seed)
        modules.append(cls(**kwargs))
    return StackedState(nn.Module(), modules, list(range(count)))


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_each_trial_gets_its_own_row_of_what_the_step_stored(backend):
    group = group_of(Keeper)
    fused = make_backend(backend, group)
    for _ in range(2):
        losses = fused.run("training_step", BATCH, 0).loss()
    for row, module in enumerate(group.modules):
        with torch.no_grad():
            own = F.cross_entropy(module(BATCH[0]), BATCH[1])
        assert module.calls == 2
        assert module.seen_list_type  # isinstance(self.outputs, list) held inside the fused step
        assert [out["step"] for out in module.outputs] == [1, 2]
        torch.testing.assert_close(module.outputs[-1]["loss"], own)
        torch.testing.assert_close(module.outputs[-1]["loss"], losses[row].detach())
        assert torch.equal(module.outputs[-1]["preds"], module(BATCH[0]).argmax(-1))
        assert len(module.by_name["loss"]) == 2
        assert module.pair[1] == 2
        torch.testing.assert_close(module.pair[0], own)
        assert not torch._C._functorch.is_batchedtensor(module.pair[0])


class ReadsItsOutputs(Keeper):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if len(self.outputs) > 1:
            loss = loss + 0.0 * self.outputs[-2]["loss"]  # reads an earlier step's per-trial value
        return loss


def test_reading_a_per_trial_element_is_refused_with_its_name_and_line_and_changes_nothing():
    group = group_of(ReadsItsOutputs)
    fused = make_backend("vmap", group)
    fused.run("training_step", BATCH, 0)
    with pytest.raises(
        FusionError,
        match=r"backend='vmap' cannot run ReadsItsOutputs.training_step as each trial would run it alone: it uses "
        r"self.outputs\[-2\]\['loss'\] \(trial 0: a tensor of shape \[\], trial 1: a tensor of shape \[\], .*\), "
        r"which differs between trials, at .*test_step_state.py:\d+ in training_step: loss = loss \+ 0.0 \* "
        r"self.outputs\[-2\]\[\"loss\"\]",
    ):
        fused.run("training_step", BATCH, 1)
    for module in group.modules:  # the refused call left every trial as it was
        assert (module.calls, len(module.outputs), len(module.by_name["loss"])) == (1, 1, 1)


class KeepsAnObject(Keeper):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.box = types.SimpleNamespace(loss=loss)
        return loss


def test_a_tensor_inside_another_object_is_refused():
    fused = make_backend("vmap", group_of(KeepsAnObject))
    with pytest.raises(FusionError, match=r"stores a SimpleNamespace object that holds a tensor in self.box"):
        fused.run("training_step", BATCH, 0)


def test_auto_timing_runs_leave_no_trace():
    group = group_of(Keeper)
    clear_backend_cache()
    candidates = [(name, lambda name=name: make_backend(name, group)) for name in ("hfta", "vmap", "loop")]

    def run_step(backend: Any) -> None:
        backend.run("training_step", BATCH, 0).loss().sum().backward()

    choose_backend(group, candidates, run_step)
    clear_backend_cache()
    for module in group.modules:
        assert (module.calls, module.outputs, module.by_name, hasattr(module, "pair")) == (0, [], {}, False)


class Threshold(DigitsMLP):
    """Its loss depends on how often the step ran: every probe must see the count as it was."""

    def __init__(self) -> None:
        super().__init__(hidden_dim=8)
        self.calls = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.calls += 1
        loss = F.cross_entropy(self(batch[0]), batch[1])
        return loss * (1.0 if self.calls == 1 else 3.0)


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_the_first_batch_check_runs_every_step_from_the_same_state_and_leaves_it(backend):
    group = group_of(Threshold, count=2)
    assert verify_fusion(group, make_backend(backend, group), [0, 1], BATCH, 0)  # no false mismatch
    assert [module.calls for module in group.modules] == [0, 0]


def test_python_state_restores_containers_in_place_and_tensors_changed_in_place():
    module = Keeper()
    module.running = torch.zeros(2)
    outputs = module.outputs
    state = PythonState([module])
    module.outputs.append(1)
    module.running += 1
    module.calls = 5
    module.extra = "new"
    state.restore()
    assert module.outputs is outputs
    assert (outputs, module.calls, hasattr(module, "extra")) == ([], 0, False)
    assert torch.equal(module.running, torch.zeros(2))


class Tracker:
    def __init__(self) -> None:
        self.values: list[torch.Tensor] = []


class HidesATensor(DigitsMLP):
    """Appends to a list inside an object of its own class: out of reach, and used at the epoch's end."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__(hidden_dim=8, lr=lr)
        self.tracker = Tracker()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.tracker.values.append(loss)
        return loss

    def on_train_epoch_end(self) -> None:
        self.log("mean", torch.stack(self.tracker.values).mean())


def test_a_tensor_kept_out_of_reach_is_explained_where_it_is_used_not_an_internal_assert():
    trials = [HidesATensor(lr) for lr in (0.1, 0.2)]
    fused = FusedLightningModule(trials, backend="vmap", summary=False, verify=False)
    with pytest.raises(
        FusionError,
        match=r"HidesATensor.on_train_epoch_end of trial 0 used a tensor that a fused step computed and kept where "
        r"lightning_hydro cannot hand each trial its own row, at .*test_step_state.py:\d+ in on_train_epoch_end",
    ):
        fit_digits(make_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0), fused)


class LogsItsFlag(DigitsMLP):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("flag", self.flag)  # logging a value that differs between trials: each trial logs its own
        return super().training_step(batch, batch_idx)


def test_a_value_that_came_to_differ_may_be_logged_per_trial():
    group = group_of(LogsItsFlag, count=3, hidden_dim=4)
    for module in group.modules:
        module.flag = 0.0
    fused = make_backend("vmap", group)  # built while the flag is the same in every trial
    for row, module in enumerate(group.modules):
        module.flag = float(row)  # then a hook sets it per trial
    trial_code_ran()
    logs = {log.name: log.values for log in fused.run("training_step", BATCH, 0).logs}
    assert logs["flag"].tolist() == [0.0, 1.0, 2.0]


def test_a_list_that_one_trial_lacks_is_a_value_that_differs():
    group = group_of(Keeper)
    fused = make_backend("vmap", group)
    del group.modules[2].outputs  # e.g. a trial that joined later, whose hooks never made it
    trial_code_ran()
    with pytest.raises(FusionError, match=r"self.outputs \(trial 0: \[\], trial 1: \[\], trial 2: <not set>\)"):
        fused.run("training_step", BATCH, 0)
    assert [module.calls for module in group.modules] == [0, 0, 0]
