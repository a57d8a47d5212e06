"""Models and measures shared by the attention and precision tests (default suite and ``-m gpu``).

The models are shaped like published ones: a CNN with the normalisation layer people pick (BatchNorm2d,
GroupNorm), an MLP with LayerNorm, and Transformer blocks as torch ships them (nn.MultiheadAttention,
nn.TransformerEncoderLayer with a causal mask or ``is_causal``) or as nanoGPT-style code writes them (a raw
``F.scaled_dot_product_attention`` with a float or boolean mask).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset, default_collate

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule
from tests.helpers import make_trainer, max_state_difference

Norm = Literal["batch", "group", "layer"]


class NormNet(L.LightningModule):
    """Digits classifier: a CNN with BatchNorm2d or GroupNorm, or (``"layer"``) an MLP with LayerNorm."""

    def __init__(self, norm: Norm = "batch", lr: float = 0.05, channels: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        c = channels
        if norm == "layer":
            self.features = nn.Sequential(
                nn.Flatten(),
                nn.Linear(64, 4 * c),
                nn.LayerNorm(4 * c),
                nn.GELU(),
                nn.Linear(4 * c, 8 * c),
                nn.LayerNorm(8 * c),
            )
        else:
            layer = (lambda n: nn.BatchNorm2d(n)) if norm == "batch" else (lambda n: nn.GroupNorm(2, n))
            self.features = nn.Sequential(
                nn.Conv2d(1, c, 3, padding=1),
                layer(c),
                nn.ReLU(),
                nn.Conv2d(c, 2 * c, 3, padding=1),
                layer(2 * c),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(2),
                nn.Flatten(),
            )
        self.head = nn.Linear(8 * c, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = (x.view(x.size(0), 1, 8, 8) - 0.3) / 0.45
        return self.head(self.features(x))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)


class PermutedDigits(DigitsDataModule):
    """The digits batches with their samples in another order: the same loss, summed in another order."""

    def __init__(self, seed: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.generator = torch.Generator().manual_seed(seed)

    def _permuted(self, samples: list[Any]) -> Any:
        order = torch.randperm(len(samples), generator=self.generator).tolist()
        return default_collate([samples[i] for i in order])

    def train_dataloader(self) -> DataLoader:
        loader = super().train_dataloader()
        return DataLoader(
            loader.dataset, batch_size=loader.batch_size, sampler=loader.sampler, collate_fn=self._permuted
        )


def attention_tokens(num: int = 64, seq: int = 12, vocab: int = 20) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, vocab, (num, seq + 1), generator=g)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


AttentionKind = Literal[
    "mha", "encoder_mask", "encoder_is_causal", "sdpa_float_mask", "sdpa_bool_mask", "sdpa_is_causal"
]


class AttentionLM(L.LightningModule):
    """A one-block causal language model; ``kind`` picks how the block attends.

    ``mha``: nn.MultiheadAttention (need_weights=False, a causal mask); ``encoder_mask`` / ``encoder_is_causal``:
    ``layers`` nn.TransformerEncoderLayers in an nn.TransformerEncoder with a causal ``mask`` (and
    ``is_causal=True``); ``sdpa_*``: a hand-written block calling ``F.scaled_dot_product_attention`` with an
    additive float mask (causal, with a distance penalty), a boolean causal mask, or ``is_causal=True``.
    """

    def __init__(
        self,
        kind: AttentionKind = "mha",
        lr: float = 1e-3,
        d_model: int = 32,
        heads: int = 4,
        vocab: int = 20,
        dropout: float = 0.0,
        layers: int = 1,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(32, d_model) * 0.02)
        if kind.startswith("encoder"):
            layer = nn.TransformerEncoderLayer(d_model, heads, 2 * d_model, dropout=dropout, batch_first=True)
            self.block: nn.Module = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        elif kind == "mha":
            self.block = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        else:
            self.block = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.readout = nn.Linear(d_model, vocab)

    def forward(self, tokens: Tensor) -> Tensor:
        n, t = tokens.shape
        kind, heads = self.hparams["kind"], self.hparams["heads"]
        h = self.embed(tokens) + self.pos[:t]
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
        if kind == "mha":
            h = h + self.block(h, h, h, attn_mask=causal, need_weights=False, is_causal=True)[0]
        elif kind == "encoder_mask":
            h = self.block(h, mask=causal)
        elif kind == "encoder_is_causal":
            h = self.block(h, mask=causal, is_causal=True)
        else:
            q, k, v = (z.reshape(n, t, heads, -1).transpose(1, 2) for z in self.block(h).chunk(3, dim=-1))
            mask: Tensor | None = None
            if kind == "sdpa_float_mask":
                distance = torch.arange(t, device=tokens.device)
                mask = causal - 0.1 * (distance[:, None] - distance[None, :]).abs().float()
            elif kind == "sdpa_bool_mask":
                mask = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
            dropout = self.hparams["dropout"] if self.training else 0.0
            attended = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=kind == "sdpa_is_causal"
            )
            h = h + self.proj(attended.transpose(1, 2).reshape(n, t, -1))
        return self.readout(self.norm(h))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(attention_tokens(), batch_size=16)


class _FirstGradients(L.Callback):
    """The gradients of the first optimizer step (after backward, before the step)."""

    def __init__(self) -> None:
        self.grads: dict[str, Tensor] = {}

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if not self.grads:
            source = pl_module.stacked if isinstance(pl_module, FusedLightningModule) else pl_module
            self.grads = {n: p.grad.detach().float().cpu() for n, p in source.named_parameters() if p.grad is not None}


def first_step_gradients(
    module: L.LightningModule, fit: Callable[[L.Trainer, L.LightningModule], None], **trainer_kwargs: Any
) -> dict[str, Tensor]:
    """The first step's gradients of ``module`` fitted by ``fit`` (a fused module's are stacked ``[B, ...]``)."""
    recorder = _FirstGradients()
    torch.manual_seed(1234)
    fit(make_trainer(max_steps=1, limit_val_batches=0, callbacks=[recorder], **trainer_kwargs), module)
    assert recorder.grads, "no gradients recorded"
    return recorder.grads


def relative_gradient_error(fused: dict[str, Tensor], row: int, alone: dict[str, Tensor]) -> float:
    """``||g_fused[row] - g_alone|| / ||g_alone||`` over all of a trial's parameters at once."""
    mine = torch.cat([fused[name.replace(".", "__")][row].flatten().double() for name in alone])
    theirs = torch.cat([g.flatten().double() for g in alone.values()])
    return float((mine - theirs).norm() / theirs.norm())


def fused_and_separate_first_gradients(
    trials: list[L.LightningModule],
    fit: Callable[[L.Trainer, L.LightningModule], None],
    *,
    backend: str,
    **trainer_kwargs: Any,
) -> list[float]:
    """Each trial's relative first-step gradient error, fused on ``backend`` against trained alone."""
    alone = [first_step_gradients(copy.deepcopy(m), fit, **trainer_kwargs) for m in trials]
    fused_module = FusedLightningModule([copy.deepcopy(m) for m in trials], backend=backend, summary=False)
    fused = first_step_gradients(fused_module, fit, **trainer_kwargs)
    return [relative_gradient_error(fused, row, grads) for row, grads in enumerate(alone)]


def norm_trials(norm: Norm) -> list[NormNet]:
    """Two NormNet trials that differ in seed and learning rate."""
    modules = []
    for seed, lr in enumerate((0.05, 0.1)):
        torch.manual_seed(seed)
        modules.append(NormNet(norm, lr=lr))
    return modules


def fit_norm_net(
    module: L.LightningModule, precision: str, steps: int, order: int | None = None, **trainer_kwargs: Any
) -> L.LightningModule:
    """``steps`` steps on the digits at ``precision`` (``order``: the samples of each batch in another order)."""
    torch.manual_seed(1234)
    data = DigitsDataModule(batch_size=64) if order is None else PermutedDigits(order, batch_size=64)
    trainer = make_trainer(max_steps=steps, limit_val_batches=0, precision=precision, **trainer_kwargs)
    trainer.fit(module, datamodule=data)
    return module.cpu()


def alone_and_spread(
    norm: Norm, precision: str, steps: int, orders: tuple[int, ...], **trainer_kwargs: Any
) -> tuple[list[L.LightningModule], float]:
    """Each trial trained alone, and the precision's spread on it.

    The spread is the largest difference (:func:`~tests.helpers.max_state_difference`) between a trial trained
    alone and the same trial trained alone with the samples of every batch in another order, over ``orders``.
    """
    separate = [fit_norm_net(copy.deepcopy(m), precision, steps, **trainer_kwargs) for m in norm_trials(norm)]
    spread = max(
        max_state_difference(fit_norm_net(copy.deepcopy(m), precision, steps, order, **trainer_kwargs), own)
        for order in orders
        for m, own in zip(norm_trials(norm), separate)
    )
    return separate, spread


def token_loader(order: int | None = None, batch_size: int = 16) -> DataLoader:
    """:func:`attention_tokens` in batches; ``order``: the samples of each batch in another (seeded) order."""
    if order is None:
        return DataLoader(attention_tokens(), batch_size=batch_size)
    generator = torch.Generator().manual_seed(order)

    def permuted(samples: list[Any]) -> Any:
        return default_collate([samples[i] for i in torch.randperm(len(samples), generator=generator).tolist()])

    return DataLoader(attention_tokens(), batch_size=batch_size, collate_fn=permuted)


def gradient_difference(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """``||a - b|| / ||b||`` over all of two unfused runs' first-step gradients at once."""
    first = torch.cat([a[name].flatten().double() for name in b])
    second = torch.cat([g.flatten().double() for g in b.values()])
    return float((first - second).norm() / second.norm())
