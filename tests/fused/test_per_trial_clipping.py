"""Per-trial gradient clipping follows Lightning's own arithmetic: bitwise on the loop backend, universal path."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from lightning_hydro.demos import DigitsMLP
from lightning_hydro.demos.template_mnist import DigitsMNISTDataModule, MNISTLitModule, SimpleDenseNet
from tests.helpers import fit_digits, seeded, train_fused, train_separately


def fit_template(trainer: Any, module: Any) -> None:
    trainer.fit(module, datamodule=DigitsMNISTDataModule(batch_size=64))


def template_trials() -> list[MNISTLitModule]:
    def build(lr: float) -> MNISTLitModule:
        return MNISTLitModule(
            net=SimpleDenseNet(lin1_size=32, lin2_size=32, lin3_size=16),
            optimizer=functools.partial(torch.optim.Adam, lr=lr, weight_decay=0.0),
            scheduler=None,
        )

    return [seeded(functools.partial(build, lr), [seed])[0] for seed, lr in enumerate((3e-3, 1e-2, 3e-2))]


class DecayGroupsMLP(DigitsMLP):
    """Weight decay on matrices only: two param groups whose order is not the module's parameter order."""

    def configure_optimizers(self) -> Any:
        named = list(self.named_parameters())
        no_decay = [p for n, p in named if n.endswith("bias")]
        decay = [p for n, p in named if not n.endswith("bias")]
        return torch.optim.AdamW(
            [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": 0.1}], lr=self.hparams["lr"]
        )


class OwnClippingMLP(DigitsMLP):
    """Clips its own gradients in the hook, with its own threshold (no Trainer setting)."""

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None, **kwargs: Any) -> None:
        self.clip_gradients(optimizer, gradient_clip_val=0.01 * self.hparams["lr"], gradient_clip_algorithm="norm")


def assert_bitwise(fused: Any, separate: list[Any]) -> None:
    for tid, module in enumerate(separate):
        mine, theirs = fused.unfuse(tid).state_dict(), module.state_dict()
        assert mine.keys() == theirs.keys()
        for key in mine:
            assert torch.equal(mine[key], theirs[key]), (tid, key)


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_template_module_clipped_on_the_loop_is_bitwise_a_separate_run(algorithm: str) -> None:
    kwargs: dict[str, Any] = dict(
        max_steps=8, gradient_clip_val=0.05, gradient_clip_algorithm=algorithm, limit_val_batches=0
    )
    trials = template_trials()
    separate = train_separately(trials, fit_template, **kwargs)
    fused = train_fused(trials, fit_template, fused_kwargs={"backend": "loop", "optimizer_path": "universal"}, **kwargs)
    assert_bitwise(fused, separate)


def test_param_groups_in_their_own_order_are_clipped_bitwise() -> None:
    kwargs: dict[str, Any] = dict(max_steps=8, gradient_clip_val=0.02, limit_val_batches=0)
    trials = [
        seeded(functools.partial(DecayGroupsMLP, hidden_dim=16, lr=lr), [i])[0] for i, lr in enumerate((1e-2, 3e-2))
    ]
    separate = train_separately(trials, fit_digits, **kwargs)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "loop", "optimizer_path": "universal"}, **kwargs)
    assert_bitwise(fused, separate)


@pytest.mark.parametrize("path", ["universal", "fused"])
def test_a_trial_that_clips_in_its_own_hook_keeps_its_rule(path: str) -> None:
    kwargs: dict[str, Any] = dict(max_steps=8, limit_val_batches=0)
    trials = [
        seeded(functools.partial(OwnClippingMLP, hidden_dim=16, lr=lr, optimizer="sgd"), [i])[0]
        for i, lr in enumerate((0.5, 2.0))
    ]
    separate = train_separately(trials, fit_digits, **kwargs)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "loop", "optimizer_path": path}, **kwargs)
    unclipped = [DigitsMLP(hidden_dim=16, lr=m.hparams["lr"], optimizer="sgd") for m in trials]
    for module, plain in zip(trials, unclipped):
        plain.load_state_dict(module.state_dict())
    plain_runs = train_separately(unclipped, fit_digits, **kwargs)
    if path == "universal":
        assert_bitwise(fused, separate)
    for tid, module in enumerate(separate):
        mine, theirs = fused.unfuse(tid).state_dict(), module.state_dict()
        for key in mine:
            torch.testing.assert_close(mine[key], theirs[key], rtol=1e-5, atol=1e-7, msg=key)
        plain = plain_runs[tid].state_dict()
        assert any(not torch.equal(theirs[key], plain[key]) for key in theirs)  # the hook really clipped
