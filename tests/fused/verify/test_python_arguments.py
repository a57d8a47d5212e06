"""Python values that differ between trials reach torch per trial on every backend, or the backend is refused.

The modules are written in the shape of Hugging Face's GPT-2 and BERT attention and timm's ViT attention (our own
small versions; transformers and timm are not dependencies): the dropout rate lives on an ``nn.Dropout`` or a
plain attribute, and the attention code hands it to ``F.scaled_dot_product_attention`` itself, in training mode
only. hfta runs a converted ``nn.Dropout``'s own ``p`` per trial, but not the value such code reads off it; the
first-batch check ran in eval mode, where the rate does not matter. A trial trained with the first trial's rate
is silently another trial.

Also: Hugging Face's ``gradient_checkpointing_enable()`` (``torch.utils.checkpoint`` in the forward) is refused
with its cause, and ``auto`` falls back to the loop.
"""

from __future__ import annotations

import copy
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends import FusionError
from lightning_hydro.backends.errors import FusionMismatchError
from lightning_hydro.demos import DigitsMLP
from tests.helpers import (
    fit_digits,
    make_trainer,
    max_state_difference,
    seeded,
    token_data,
    train_fused,
    train_separately,
)


class TinyConfig:
    """A config object as Hugging Face passes to every layer: a plain class of its own (``PretrainedConfig``'s shape).

    (A dataclass, a namespace or an OmegaConf config the attribute scan opens and compares field by field:
    ``tests/fused/test_config_objects.py``; an object of the user's own class it cannot.)
    """

    def __init__(
        self,
        vocab: int = 20,
        d_model: int = 16,
        heads: int = 2,
        attn_pdrop: float = 0.0,
        hidden_dropout_prob: float = 0.0,
    ) -> None:
        self.vocab, self.d_model, self.heads = vocab, d_model, heads
        self.attn_pdrop, self.hidden_dropout_prob = attn_pdrop, hidden_dropout_prob


class GPT2StyleAttention(nn.Module):
    """GPT-2's layout: an nn.Dropout holds the rate; the SDPA path reads ``self.attn_dropout.p`` in training."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.c_attn = nn.Linear(config.d_model, 3 * config.d_model)
        self.c_proj = nn.Linear(config.d_model, config.d_model)
        self.attn_dropout = nn.Dropout(config.attn_pdrop)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        n, t, d = h.shape
        q, k, v = (z.reshape(n, t, self.heads, -1).transpose(1, 2) for z in self.c_attn(h).split(d, dim=-1))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_dropout.p if self.training else 0.0, is_causal=True
        )
        return self.c_proj(y.transpose(1, 2).reshape(n, t, d))


class BertStyleAttention(GPT2StyleAttention):
    """BERT's SDPA layout: the rate is a plain attribute, ``self.dropout_prob``."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        self.dropout_prob = config.attn_pdrop

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        n, t, d = h.shape
        q, k, v = (z.reshape(n, t, self.heads, -1).transpose(1, 2) for z in self.c_attn(h).split(d, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout_prob if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).reshape(n, t, d))


class ViTStyleAttention(GPT2StyleAttention):
    """timm's ViT layout: ``self.attn_drop = nn.Dropout(attn_drop)``, handed on as ``self.attn_drop.p``."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        del self.attn_dropout
        self.attn_drop = nn.Dropout(config.attn_pdrop)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        n, t, d = h.shape
        q, k, v = (z.reshape(n, t, self.heads, -1).transpose(1, 2) for z in self.c_attn(h).split(d, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).reshape(n, t, d))


class ConfigDropoutAttention(GPT2StyleAttention):
    """Reads the rate off the config object itself, which no attribute comparison can see."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        self.config = config

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.dropout(super().forward(h), self.config.hidden_dropout_prob, self.training)


ATTENTION = {
    "gpt2": GPT2StyleAttention,
    "bert": BertStyleAttention,
    "vit": ViTStyleAttention,
    "config": ConfigDropoutAttention,
}


class TinyLM(L.LightningModule):
    """Embedding, one attention block of the given style, readout; trials differ in their dropout rate."""

    def __init__(self, style: str = "gpt2", pdrop: float = 0.0, lr: float = 3e-3, checkpointing: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        # the config style differs in the config's own rate only, which no attribute of a module holds
        config = (
            TinyConfig(attn_pdrop=0.0, hidden_dropout_prob=pdrop) if style == "config" else TinyConfig(attn_pdrop=pdrop)
        )
        self.wte = nn.Embedding(config.vocab, config.d_model)
        self.attn = ATTENTION[style](config)
        self.ln = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab)
        self.gradient_checkpointing = checkpointing

    def gradient_checkpointing_enable(self) -> None:
        """As Hugging Face's models: recompute the block's activations during backward."""
        self.gradient_checkpointing = True

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.wte(tokens)
        if self.gradient_checkpointing and self.training:
            h = h + checkpoint(self.attn, h, use_reentrant=False)
        else:
            h = h + self.attn(h)
        return self.head(self.ln(h))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(token_data(num=128), batch_size=32)


def same_start(style: str, rates: tuple[float, ...], **kwargs: Any) -> list[TinyLM]:
    """Trials that differ ONLY in their dropout rate: same weights, same lr."""
    modules = []
    for rate in rates:
        torch.manual_seed(0)
        modules.append(TinyLM(style, rate, **kwargs))
    return modules


ATTRIBUTE = {"gpt2": r"attn.attn_dropout.p", "bert": r"attn.dropout_prob", "vit": r"attn.attn_drop.p"}


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
@pytest.mark.parametrize("style", ["gpt2", "bert", "vit"])
def test_a_dropout_rate_the_attention_code_hands_to_torch_is_refused_with_its_name(style, backend):
    with pytest.raises(
        FusionMismatchError,
        match=rf"backend='{backend}' cannot fuse these TinyLM trials: .*{ATTRIBUTE[style]} \(trial 0: 0.0, trial 1: "
        r"0.0, trial 2: 0.9\)",
    ):
        FusedLightningModule(same_start(style, (0.0, 0.0, 0.9)), backend=backend)


def test_hfta_says_why_the_setting_of_a_module_it_converts_is_not_per_trial_here():
    with pytest.raises(FusionMismatchError, match=r"read by the forward of 'attn'.*hands it on itself"):
        FusedLightningModule(same_start("gpt2", (0.0, 0.9)), backend="hfta")


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_a_rate_read_off_a_config_object_is_caught_in_training_mode_on_the_first_batch(backend):
    fused = FusedLightningModule(same_start("config", (0.0, 0.9)), backend=backend, summary=False)
    with pytest.raises(
        FusionMismatchError,
        match=r"in training mode, trial 1's own training_step differs from the fused one: at "
        r".*test_python_arguments.py:\d+ it hands dropout other values \(argument p: trial's own 0.9, fused 0.0\)",
    ):
        make_trainer(max_steps=2).fit(fused)


@pytest.mark.parametrize("style", ["gpt2", "bert", "vit", "config"])
def test_auto_trains_each_trial_with_its_own_rate(style):
    # trials 0 and 1 differ only in their rate: trained with trial 0's rate, trial 1 would equal it bitwise
    trials = same_start(style, (0.0, 0.9))
    # the universal optimizer path: each trial's own AdamW, so that the loop is bitwise a trial trained alone;
    # deterministic: auto takes the first of hfta, vmap, loop that runs, whatever timing would favour
    fused = FusedLightningModule(trials, backend="auto", optimizer_path="universal", deterministic=True, summary=False)
    torch.manual_seed(1234)
    make_trainer(max_steps=6).fit(fused)
    assert fused.backend == "loop"
    moved = max((a - b).abs().max().item() for a, b in zip(fused.unfuse(0).parameters(), fused.unfuse(1).parameters()))
    assert moved > 1e-4
    alone = copy.deepcopy(same_start(style, (0.0,))[0])
    make_trainer(max_steps=6).fit(alone)
    assert max_state_difference(fused.unfuse(0), alone) < 1e-6  # the rate-0 trial: no randomness, as alone


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_gradient_checkpointing_is_refused_with_its_cause(backend):
    trials = same_start("gpt2", (0.0, 0.0), lr=1e-3)
    for trial, lr in zip(trials, (1e-3, 3e-3)):
        trial.hparams["lr"] = lr
        trial.gradient_checkpointing_enable()
    fused = FusedLightningModule(trials, backend=backend, summary=False)
    with pytest.raises(
        FusionError,
        match=rf"backend='{backend}' cannot fuse TinyLM.training_step: it uses activation "
        r"checkpointing \(torch.utils.checkpoint, which Hugging Face's gradient_checkpointing_enable\(\)",
    ):
        make_trainer(max_steps=2).fit(fused)


def test_auto_falls_back_to_the_loop_for_gradient_checkpointing_and_says_why():
    trials = same_start("gpt2", (0.0, 0.0), checkpointing=True)
    separate = copy.deepcopy(trials)
    fused = FusedLightningModule(trials, backend="auto", optimizer_path="universal", summary=False)
    make_trainer(max_steps=3).fit(fused)
    assert fused.backend == "loop"
    assert "skipped: backend='vmap' cannot fuse TinyLM.training_step: it uses activation checkpointing" in (
        fused.backend_report
    )
    make_trainer(max_steps=3).fit(separate[1])
    assert max_state_difference(fused.unfuse(1), separate[1]) < 1e-6


class DropoutSchedule(L.LightningModule):
    """A hook raises the dropout rate of an nn.Dropout from the second epoch on, to the trial's own final rate."""

    def __init__(self, final_p: float = 0.0, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.0), nn.Linear(32, 10))

    def on_train_epoch_start(self) -> None:
        self.net[2].p = self.hparams["final_p"] if self.current_epoch >= 1 else 0.0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])


def scheduled(rates: tuple[float, ...]) -> list[DropoutSchedule]:
    modules = []
    for rate in rates:
        torch.manual_seed(0)
        modules.append(DropoutSchedule(rate))
    return modules


def test_vmap_refuses_a_setting_a_hook_makes_differ():
    fused = FusedLightningModule(scheduled((0.0, 0.5)), backend="vmap", summary=False)
    with pytest.raises(FusionMismatchError, match=r"net.2.p \(trial 0: 0.0, trial 1: 0.5\)"):
        fit_digits(make_trainer(max_epochs=2, limit_train_batches=3), fused)


def test_hfta_runs_a_setting_a_hook_changes_with_each_trials_own_value():
    # same weights and lr: had hfta kept the rate it converted (0 for both), the trials would stay bitwise equal
    fused = FusedLightningModule(scheduled((0.0, 0.5)), backend="hfta", summary=False)
    fit_digits(make_trainer(max_epochs=2, limit_train_batches=3), fused)
    moved = max((a - b).abs().max().item() for a, b in zip(fused.unfuse(0).parameters(), fused.unfuse(1).parameters()))
    assert moved > 1e-4


class _StraightThroughClamp(torch.autograd.Function):
    """A clamp whose gradient passes straight through (quantisation-aware training's shape), with a vmap rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
        return x.clamp(low, high)

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad, None, None


class ClampedMLP(DigitsMLP):
    def __init__(self, low: float = 0.0, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.low = low

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_StraightThroughClamp.apply(self.body(x), self.low, 2.0))


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_a_custom_autograd_function_with_a_vmap_rule_fuses_as_alone(backend: str) -> None:
    # before, the training-mode check saw the Function's calls in the trial's own run only (under vmap its forward
    # runs where torch function modes are not seen) and refused: "the Python code takes another path"
    rates = iter([0.05, 0.1, 0.2])
    trials = seeded(lambda: ClampedMLP(lr=next(rates)), [0, 1, 2])
    alone = train_separately(trials, fit_digits, max_steps=6)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": backend}, max_steps=6)
    for row, own in enumerate(alone):
        assert max_state_difference(fused.unfuse(row), own) <= 1e-6


def test_a_per_trial_value_handed_to_a_custom_autograd_function_is_still_refused() -> None:
    trials = [ClampedMLP(low=low) for low in (0.0, 0.5)]
    with pytest.raises(FusionMismatchError, match=r"low \(trial 0: 0.0, trial 1: 0.5\)"):
        FusedLightningModule(trials, backend="vmap", summary=False)
