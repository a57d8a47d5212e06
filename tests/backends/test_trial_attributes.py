"""The scan of the trials' Python values, and the one comparison it shares with the hfta conversion."""

import ast
import importlib
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch import nn

import lightning_hydro
from lightning_hydro.backends.hfta.per_trial import differing_attributes
from lightning_hydro.backends.trial_attributes import scan_attributes


class Head(nn.Module):
    def __init__(self, scale: float, tags: list[str], offsets: torch.Tensor) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.scale = scale
        self.tags = tags
        self.offsets = offsets  # a plain tensor: not a parameter or buffer
        self.helper = object()  # not a plain value: left to the first-batch check

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale + self.offsets


def test_the_scan_reports_each_plain_value_that_differs_with_every_trial_value():
    trials = [
        nn.Sequential(Head(1.0, ["a"], torch.zeros(2)), nn.Dropout(0.1)),
        nn.Sequential(Head(2.0, ["a"], torch.zeros(2, dtype=torch.float64)), nn.Dropout(0.1)),
        nn.Sequential(Head(1.0, ["a"], torch.zeros(2)), nn.Dropout(0.5)),
    ]
    found = {a.qualified_name: a for a in scan_attributes(trials, ids=[3, 4, 5])}
    assert sorted(found) == ["0.offsets", "0.scale", "1.p"]  # tags are equal, helper is not a plain value
    assert found["0.scale"].values == (1.0, 2.0, 1.0)
    assert found["0.scale"].ids == (3, 4, 5)
    assert str(found["1.p"]) == "1.p (trial 3: 0.1, trial 4: 0.1, trial 5: 0.5)"


def test_an_attribute_one_trial_lacks_differs_and_shows_as_missing():
    first, second = nn.Dropout(0.1), nn.Dropout(0.1)
    second.extra = 3
    (attribute,) = scan_attributes([first, second], ids=[0, 1])
    assert (attribute.name, attribute.values) == ("extra", ("<missing>", 3))


def test_the_per_module_comparison_sees_only_the_module_s_own_attributes():
    trials = [nn.Sequential(nn.Dropout(p)) for p in (0.1, 0.5)]
    assert differing_attributes(trials) == []
    assert differing_attributes([trial[0] for trial in trials]) == ["p"]


def test_one_function_is_named_differing_attributes():
    package = Path(lightning_hydro.__file__).parent
    defined = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name == "differing_attributes"
    )
    assert defined == ["backends/hfta/per_trial.py"]


def test_the_old_scan_name_resolves_with_a_warning():
    module = importlib.import_module("lightning_hydro.backends.trial_attributes")
    with pytest.warns(DeprecationWarning, match=r"trial_attributes.differing_attributes is renamed scan_attributes"):
        assert module.differing_attributes is scan_attributes


def test_the_removed_verify_helper_still_returns_its_text_with_a_warning():
    verify = importlib.import_module("lightning_hydro.fused.verify")
    trials = [nn.Sequential(nn.Linear(2, 2), nn.Dropout(p)) for p in (0.1, 0.5)]
    with pytest.warns(DeprecationWarning, match=r"verify.differing_attributes is removed: use \[str\(a\) for a in"):
        old = verify.differing_attributes
    assert old(trials, ids=[0, 1]) == ["1.p (trial 0: 0.1, trial 1: 0.5)"]


def test_the_code_scan_follows_super_into_the_users_base_classes():
    # before, super().training_step resolved to the subclass's own method again: the parent's writes (a counter, a
    # list) were not found, and compile=True traced them as if the step changed nothing (weights 4e-2 to 0.24 away
    # from alone, the counter 11 after 6 steps)
    import lightning as L

    from lightning_hydro.backends.trial_attributes import state_writes

    class Parent(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(2, 1)
            self.calls = 0
            self.losses: list = []

        def training_step(self, batch, batch_idx):
            self.calls += 1
            loss = self.net(batch).sum()
            self.losses.append(loss.detach())
            return loss

    class Child(Parent):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch, batch_idx)

    class Centering(nn.Linear):  # a submodule whose base's forward (reached by super) writes a buffer
        pass

    class Running(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("running", torch.zeros(2))

        def forward(self, x):
            self.running = 0.9 * self.running + 0.1 * x.mean(0)
            return x - self.running

    class Chained(Running):
        def forward(self, x):
            return super().forward(x)

    class WithChained(Child):
        def __init__(self) -> None:
            super().__init__()
            self.center = Chained()
            self.plain = Centering(2, 2)  # torch's own forward: not followed into torch's code

    assert set(state_writes(Child())) >= {"calls", "losses.append"}
    assert set(state_writes(WithChained())) == {"calls", "losses.append", "running"}


def test_a_hook_storing_into_a_container_it_holds_writes_state():
    # before, subscript stores were not seen: a hook counting into a dict ran on the first trial only, and the next
    # batch was refused for values that differed only because of that (tests/fused/lightning/test_batch_transfer_hooks)
    from lightning_hydro.backends.trial_attributes import hook_writes

    class Hooks:
        def counting(self, batch, dataloader_idx):
            self.seen["train"] += 1
            return batch

        def through_a_local(self, batch, dataloader_idx):
            seen = self.seen
            seen[dataloader_idx] = 1
            return batch

        def deleting(self, batch, dataloader_idx):
            del self.cache[dataloader_idx]
            return batch

        def into_the_batch(self, batch, dataloader_idx):
            batch["x"] = batch["x"] * 2  # the hook's own argument: not the module's state
            return batch

    assert hook_writes(Hooks, "counting") == ("[...]",)
    assert hook_writes(Hooks, "through_a_local") == ("[...]",)
    assert hook_writes(Hooks, "deleting") == ("cache[...]",)
    assert hook_writes(Hooks, "into_the_batch") == ()


def _config_trials(kind: str) -> list[nn.Module]:
    """Trials that keep a per-trial anneal length and a per-trial lr in a config object, as Hydra projects do."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    @dataclass
    class Loss:
        anneal_steps: int
        lr: float

    class Annealed(nn.Module):
        def __init__(self, anneal_steps: int, lr: float) -> None:
            super().__init__()
            self.linear = nn.Linear(2, 2)
            if kind == "dataclass":
                self.cfg = Loss(anneal_steps, lr)
            elif kind == "namespace":
                self.cfg = SimpleNamespace(anneal_steps=anneal_steps, lr=lr)
            else:
                self.cfg = OmegaConf.create({"loss": {"anneal_steps": anneal_steps}, "optim": {"lr": lr}})

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            steps = self.cfg.loss.anneal_steps if kind == "dictconfig" else self.cfg.anneal_steps
            return self.linear(x) / steps

    return [Annealed(steps, lr) for steps, lr in ((2, 0.1), (7, 0.2))]


@pytest.mark.parametrize("kind", ["dataclass", "namespace", "dictconfig"])
def test_a_value_inside_a_config_object_that_the_fused_code_reads_is_found(kind: str):
    # before, config objects were not compared: a per-trial anneal length in one ran with trial 0's under vmap
    found = {a.qualified_name: a for a in scan_attributes(_config_trials(kind), ids=[0, 1])}
    steps = "cfg.loss.anneal_steps" if kind == "dictconfig" else "cfg.anneal_steps"
    lr = "cfg.optim.lr" if kind == "dictconfig" else "cfg.lr"
    assert found[steps].values == (2, 7)
    assert found[steps].read
    assert not found[lr].read  # only the trial's own configure_optimizers would read it: no refusal for a sweep's lr


def test_hyperparameters_saved_from_a_dictconfig_are_compared_as_a_dict_of_hparams():
    from omegaconf import OmegaConf

    class FromConfig(L.LightningModule):
        def __init__(self, cfg: Any) -> None:
            super().__init__()
            self.save_hyperparameters(cfg)  # self.hparams is the DictConfig
            self.linear = nn.Linear(2, 2)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.linear(batch).sum() * min(1.0, self.global_step / self.hparams.anneal_steps)

    trials = [FromConfig(OmegaConf.create({"anneal_steps": s, "lr": lr})) for s, lr in ((2, 0.1), (7, 0.2))]
    found = {a.qualified_name: a for a in scan_attributes(trials, ids=[0, 1])}
    assert found["hparams.anneal_steps"].values == (2, 7)
    assert found["hparams.anneal_steps"].read
    assert not found["hparams.lr"].read
