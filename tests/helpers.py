"""Shared test helpers: quiet Trainers, small models of several kinds, and tensor comparisons."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import Logger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP


class QuietLogger(Logger):
    """A Lightning logger that keeps what ``log_metrics`` gets its own way (subclasses say how) and nothing else."""

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


class SeriesLogger(QuietLogger):
    """Keeps every call of ``log_metrics``: each name's (step, value) in the order logged."""

    def __init__(self) -> None:
        super().__init__()
        self.series: dict[str, list[tuple[int | None, float]]] = {}

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        for key, value in metrics.items():
            if key != "epoch":  # Lightning adds it to the rows it logs itself
                self.series.setdefault(key, []).append((step, float(value)))


def make_trainer(**overrides: Any) -> L.Trainer:
    kwargs: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    kwargs.update(overrides)
    return L.Trainer(**kwargs)


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    denom = b.norm().item()
    return (a - b).norm().item() / (denom if denom > 0 else 1.0)


def max_state_difference(a: nn.Module, b: nn.Module) -> float:
    """Largest relative difference over every parameter and floating buffer of two modules."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    worst = 0.0
    for key in sa:
        if sa[key].is_floating_point():
            worst = max(worst, relative_difference(sa[key], sb[key]))
        else:
            assert torch.equal(sa[key], sb[key]), key
    return worst


def _cancelled_by_batch_norm(module: nn.Module) -> set[str]:
    """State entries that carry only rounding noise: biases feeding a BatchNorm, and that BatchNorm's running mean.

    BatchNorm subtracts the batch mean, so a bias right before it gets an exactly-zero gradient: its gradient is
    float rounding, which Adam rescales into lr-sized steps (and the running mean follows them). Two correct
    implementations that round differently (fused or not, one CPU or another) part there by up to ~1e-1.
    """
    names: set[str] = set()
    for prefix, container in module.named_modules():
        children = list(container.named_children())
        for (name, first), (next_name, second) in itertools.pairwise(children):
            if isinstance(second, nn.modules.batchnorm._BatchNorm) and getattr(first, "bias", None) is not None:
                path = f"{prefix}.{name}" if prefix else name
                names.add(f"{path}.bias")
                names.add(f"{prefix}.{next_name}.running_mean" if prefix else f"{next_name}.running_mean")
    return names


def learned_state_difference(a: nn.Module, b: nn.Module) -> float:
    """Relative difference over every floating state entry at once, except those only rounding noise drives."""
    sa, sb = a.state_dict(), b.state_dict()
    noise = _cancelled_by_batch_norm(a)
    keys = [k for k in sb if sb[k].is_floating_point() and k not in noise]
    return relative_difference(
        torch.cat([sa[k].flatten().double() for k in keys]), torch.cat([sb[k].flatten().double() for k in keys])
    )


def seeded(factory: Callable[[], L.LightningModule], seeds: Sequence[int]) -> list[L.LightningModule]:
    modules = []
    for seed in seeds:
        torch.manual_seed(seed)
        modules.append(factory())
    return modules


def train_separately(
    modules: Sequence[L.LightningModule], fit: Callable[[L.Trainer, L.LightningModule], None], **trainer_kwargs: Any
) -> list[L.LightningModule]:
    """Train deep copies of the modules, each by its own Trainer."""
    trained = []
    for module in modules:
        copy_ = copy.deepcopy(module)
        torch.manual_seed(1234)
        fit(make_trainer(**trainer_kwargs), copy_)
        trained.append(copy_)
    return trained


def train_fused(
    modules: Sequence[L.LightningModule],
    fit: Callable[[L.Trainer, L.LightningModule], None],
    *,
    fused_kwargs: dict[str, Any] | None = None,
    **trainer_kwargs: Any,
) -> FusedLightningModule:
    fused = FusedLightningModule([copy.deepcopy(m) for m in modules], summary=False, **(fused_kwargs or {}))
    torch.manual_seed(1234)
    fit(make_trainer(**trainer_kwargs), fused)
    return fused


def fit_digits(trainer: L.Trainer, module: L.LightningModule, batch_size: int = 64, **fit_kwargs: Any) -> None:
    trainer.fit(module, datamodule=DigitsDataModule(batch_size=batch_size), **fit_kwargs)


class StopTrialAt(L.Callback):
    """Stops trial 1 after the given number of steps: the group shrinks (a slot change)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        if trainer.global_step == self.at and 1 in pl_module.trial_ids:
            pl_module.stop_trial(1, "test")


def fit_plain(trainer: L.Trainer, module: L.LightningModule) -> None:
    trainer.fit(module)


def mixed_optimizer_mlps(hidden_dim: int = 32) -> list[DigitsMLP]:
    """Four MLP trials: different learning rates, SGD with momentum, Adam and AdamW in one group."""
    configs = [
        dict(lr=0.05, optimizer="sgd", momentum=0.9),
        dict(lr=0.2, optimizer="sgd", momentum=0.0, weight_decay=1e-3),
        dict(lr=1e-3, optimizer="adam"),
        dict(lr=3e-3, optimizer="adamw", weight_decay=0.05),
    ]
    modules = []
    for seed, config in enumerate(configs):
        torch.manual_seed(seed)
        modules.append(DigitsMLP(hidden_dim=hidden_dim, **config))
    return modules


class DigitsCNN(L.LightningModule):
    """A small CNN with BatchNorm on the 8x8 digits (running statistics are per trial)."""

    def __init__(self, lr: float = 0.05, momentum: float = 0.9, channels: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.BatchNorm2d(2 * channels),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Linear(8 * channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Standardised pixels, as any CNN pipeline feeds them. On the raw digits most pixels are exactly 0,
        # so many pre-activations sit exactly on ReLU's kink; there a 1e-7 rounding difference between two
        # correct implementations (vmap's grouped convolution versus a plain one) flips a unit and the runs
        # part at the 1e-4 level after ~20 steps. The loop backend, bitwise exact, is tested on both.
        x = (x.view(x.size(0), 1, 8, 8) - 0.3) / 0.45
        return self.head(self.features(x).flatten(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=self.hparams["momentum"])


def token_data(num: int = 256, seq: int = 12, vocab: int = 20, seed: int = 0) -> TensorDataset:
    """A tiny next-token task with padding at the end of some sequences (pad id 0)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (num, seq + 1), generator=g)
    lengths = torch.randint(seq // 2, seq + 2, (num,), generator=g)
    positions = torch.arange(seq + 1).expand(num, -1)
    tokens = tokens.masked_fill(positions >= lengths[:, None], 0)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


class NextTokenLM(L.LightningModule):
    """The training of the token models here: next-token cross-entropy (padding ignored), AdamW, token_data()."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=0)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(token_data(), batch_size=32)


class TinyAttentionLM(NextTokenLM):
    """Embedding (with padding_idx) + LayerNorm + causal multi-head attention + MLP + readout."""

    def __init__(self, lr: float = 1e-3, d_model: int = 16, vocab: int = 20, heads: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, d_model, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(32, d_model) * 0.02)
        self.norm1 = nn.LayerNorm(d_model)
        # No qkv bias: the key bias has an exactly-zero gradient (softmax ignores a shift shared by all keys), so
        # its gradient is pure rounding noise, which Adam rescales into lr-sized steps that differ between any
        # two implementations that round differently (fused or not, CPU or GPU). Measured: 3e-3 apart after
        # 30 steps with it, 5e-7 without.
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))
        self.readout = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n, t = tokens.shape
        h = self.embed(tokens) + self.pos[:t]
        q, k, v = self.qkv(self.norm1(h)).chunk(3, dim=-1)
        heads = self.hparams["heads"]
        q, k, v = (z.reshape(n, t, heads, -1).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(attn.transpose(1, 2).reshape(n, t, -1))
        h = h + self.mlp(self.norm2(h))
        return self.readout(h)


class TiedAttentionLM(TinyAttentionLM):
    """TinyAttentionLM with its readout tied to its embedding (one tensor under two names, as GPT-2 ties them)."""

    def __init__(self, lr: float = 1e-3, d_model: int = 16, vocab: int = 20, heads: int = 2) -> None:
        super().__init__(lr, d_model, vocab, heads)
        self.readout.weight = self.embed.weight


class ScheduledMLP(DigitsMLP):
    """An MLP whose configure_optimizers returns one of Lightning's scheduler configurations."""

    def __init__(self, schedule: str = "step", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.schedule = schedule

    def configure_optimizers(self) -> Any:
        optimizer = super().configure_optimizers()
        if self.schedule == "step":
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.5)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 2},
            }
        if self.schedule == "epoch":
            return [optimizer], [torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)]
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.1, patience=0)
        return {"optimizer": optimizer, "lr_scheduler": plateau, "monitor": "val_acc"}


class TorchEncoderLM(L.LightningModule):
    """Embedding + torch's own nn.TransformerEncoderLayer (nn.MultiheadAttention inside) + readout."""

    def __init__(self, lr: float = 1e-3, d_model: int = 16, vocab: int = 20) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, d_model, padding_idx=0)
        layer = nn.TransformerEncoderLayer(d_model, 2, 2 * d_model, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.readout = nn.Linear(d_model, vocab)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        mask = nn.Transformer.generate_square_subsequent_mask(x.size(1))
        logits = self.readout(self.encoder(self.embed(x), mask=mask, src_key_padding_mask=x == 0))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=0)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(token_data(), batch_size=32)


def wait_for_file(path: Path, timeout_s: float = 120.0) -> bool:
    """Whether ``path`` exists within ``timeout_s`` (files that a background process writes, e.g. sweep plots)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def attention_nodes(output: torch.Tensor) -> list[str]:
    """The names of the attention kernels' backward nodes in ``output``'s autograd graph."""
    found, seen, stack = [], set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if "Attention" in type(node).__name__:
            found.append(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found
