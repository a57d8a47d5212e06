"""The char-LM task: a small character-level Transformer trained on the Python standard library's source.

The text is a fixed, sorted list of modules read from the running interpreter's own standard library
(``sysconfig.get_paths()["stdlib"]``): nothing is downloaded, and every run reads the same files. Characters
are ASCII codes (anything else becomes ``?``), so the vocabulary is fixed at 128.

The model is written for muP and for fused training: its width is one hyperparameter (``d_model``; the
number of heads is fixed, so the head dimension scales with it), attention logits are scaled by
``1 / d_head`` (muP's choice, instead of ``1 / sqrt(d_head)``), every layer keeps PyTorch's fan-in init,
the output layer is a plain ``nn.Linear`` (the muP readout), and ``forward`` has no data-dependent Python
control flow, so it runs under ``torch.func.vmap``.

Run it (a few minutes on a laptop CPU)::

    python -m lightning_hydro.demos.char_lm

Example::

    >>> import lightning as L
    >>> dm = CharDataModule(block_size=32, batch_size=16, files=("bisect.py",))
    >>> model = CharTransformer(d_model=32, block_size=32, lr=3e-3)
    >>> trainer = L.Trainer(max_epochs=1, limit_train_batches=5, limit_val_batches=2, logger=False,
    ...                     enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    >>> trainer.fit(model, datamodule=dm)
    >>> 0.0 < float(trainer.callback_metrics["val_loss"]) < 5.0
    True
"""

from __future__ import annotations

import math
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override

__all__ = [
    "STDLIB_FILES",
    "VOCAB_SIZE",
    "CharDataModule",
    "CharTransformer",
    "decode",
    "encode",
    "read_stdlib",
]

VOCAB_SIZE = 128
STDLIB_FILES = (
    "argparse.py",
    "ast.py",
    "calendar.py",
    "contextlib.py",
    "csv.py",
    "dataclasses.py",
    "functools.py",
    "heapq.py",
    "random.py",
    "shlex.py",
    "string.py",
    "textwrap.py",
)
"""About 420,000 characters of standard-library source, present in every CPython >= 3.10."""


def read_stdlib(files: Sequence[str] = STDLIB_FILES) -> list[str]:
    """The text of ``files`` (paths relative to the standard library directory), in the order given.

    Raises:
        FileNotFoundError: a file the interpreter does not ship (some distributions strip sources).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    missing = [name for name in files if not (root / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"read_stdlib: {missing} not found under {root}; this Python ships no source for them. Pass "
            "files=... naming modules it has, or use an interpreter with its standard-library sources."
        )
    return [(root / name).read_text(encoding="utf-8") for name in files]


def encode(text: str) -> torch.Tensor:
    """Character codes of ``text`` as a long tensor; non-ASCII characters become ``?``.

    Example::

        >>> encode("hi é").tolist()
        [104, 105, 32, 63]
    """
    return torch.frombuffer(bytearray(text.encode("ascii", errors="replace")), dtype=torch.uint8).long()


def decode(codes: torch.Tensor) -> str:
    """Inverse of ``encode``.

    Example::

        >>> decode(encode("def f():"))
        'def f():'
    """
    return bytes(codes.tolist()).decode("ascii")


class _Windows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping windows of ``block_size`` codes and their next-character targets."""

    def __init__(self, codes: torch.Tensor, block_size: int) -> None:
        self.codes = codes
        self.block_size = block_size

    def __len__(self) -> int:
        return (len(self.codes) - 1) // self.block_size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.block_size
        chunk = self.codes[start : start + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class CharDataModule(L.LightningDataModule):
    """Standard-library source as next-character prediction: the last part of every file is validation.

    Args:
        block_size: characters per example (the model's context length).
        batch_size: examples per training batch (validation uses 4x as many).
        files: standard-library files to read, relative to its directory.
        val_fraction: share of each file held out, taken from its end.
        seed: seeds the shuffling order, so reruns see identical batches.
    """

    def __init__(
        self,
        block_size: int = 64,
        batch_size: int = 32,
        files: Sequence[str] = STDLIB_FILES,
        val_fraction: float = 0.1,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if block_size < 1 or batch_size < 1:
            raise ValueError(
                f"CharDataModule: block_size and batch_size must be >= 1, got {block_size} and {batch_size}."
            )
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"CharDataModule: val_fraction must be in (0, 1), got {val_fraction}.")
        self.block_size = block_size
        self.batch_size = batch_size
        self.files = tuple(files)
        self.val_fraction = val_fraction
        self.seed = seed
        self.train_set: _Windows | None = None
        self.val_set: _Windows | None = None

    @override
    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        train, val = [], []
        for text in read_stdlib(self.files):
            cut = int(len(text) * (1.0 - self.val_fraction))
            train.append(text[:cut])
            val.append(text[cut:])
        self.train_set = _Windows(encode("\n".join(train)), self.block_size)
        self.val_set = _Windows(encode("\n".join(val)), self.block_size)

    @override
    def train_dataloader(self) -> DataLoader:
        assert self.train_set is not None  # set by setup(); Lightning always calls it first
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, generator=generator)

    @override
    def val_dataloader(self) -> DataLoader:
        assert self.val_set is not None
        return DataLoader(self.val_set, batch_size=4 * self.batch_size)


class _Block(nn.Module):
    """Pre-norm Transformer block: causal self-attention and a 4x MLP, each added to the residual."""

    causal: torch.Tensor

    def __init__(self, d_model: int, n_heads: int, block_size: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.scale = n_heads / d_model  # muP: 1 / d_head, so attention logits stay O(1) as width grows
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        mask = torch.ones(block_size, block_size, dtype=torch.bool).tril()
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        q, k, v = (t.reshape(batch, time, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        logits = (q @ k.transpose(-2, -1)) * self.scale
        logits = logits.masked_fill(~self.causal[:time, :time], float("-inf"))
        attended = (logits.softmax(dim=-1) @ v).transpose(1, 2).reshape(batch, time, width)
        x = x + self.proj(attended)
        return x + self.mlp(self.norm2(x))


class CharTransformer(L.LightningModule):
    """A small GPT-style character model, with the hyperparameters a sweep would tune.

    Args:
        d_model: residual width (the muP width hyperparameter); a multiple of ``n_heads``.
        n_layers: Transformer blocks.
        n_heads: attention heads (fixed as width scales; the head dimension is ``d_model / n_heads``).
        block_size: longest context, in characters.
        lr: peak learning rate of AdamW.
        warmup_steps: steps of linear learning-rate warm-up from ``lr / warmup_steps`` (0: none).
        weight_decay: AdamW's decoupled weight decay, applied to matrices only.
    """

    def __init__(
        self,
        d_model: int = 128,
        n_layers: int = 2,
        n_heads: int = 4,
        block_size: int = 64,
        lr: float = 3e-3,
        warmup_steps: int = 0,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(
                f"CharTransformer: d_model ({d_model}) must be a multiple of n_heads ({n_heads}); change one of them."
            )
        if warmup_steps < 0:
            raise ValueError(f"CharTransformer: warmup_steps must be >= 0, got {warmup_steps}.")
        self.save_hyperparameters()
        self.tokens = nn.Embedding(VOCAB_SIZE, d_model)
        self.positions = nn.Embedding(block_size, d_model)
        self.blocks = nn.Sequential(*(_Block(d_model, n_heads, block_size) for _ in range(n_layers)))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB_SIZE)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Next-character logits ``[batch, time, 128]`` for codes ``[batch, time]``."""
        x = self.tokens(codes) + self.positions.weight[: codes.shape[-1]]
        return self.head(self.norm(self.blocks(x)))

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Mean next-character cross-entropy (nats) of a batch."""
        codes, targets = batch
        return F.cross_entropy(self(codes).flatten(0, -2), targets.flatten())

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss

    @override
    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss = self.loss(batch)
        self.log("val_loss", loss)
        self.log("val_bpc", loss / math.log(2.0))

    @override
    def configure_optimizers(self) -> Any:
        hp = self.hparams
        weight_decay, lr, warmup_steps = hp["weight_decay"], hp["lr"], hp["warmup_steps"]
        matrices = [p for p in self.parameters() if p.dim() >= 2]
        vectors = [p for p in self.parameters() if p.dim() < 2]
        groups = [
            {"params": matrices, "weight_decay": weight_decay},
            {"params": vectors, "weight_decay": 0.0},
        ]
        optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))
        if warmup_steps == 0:
            return optimizer
        warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0 / warmup_steps, total_iters=warmup_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


def main() -> None:  # pragma: no cover - a demo run, exercised in reduced form by the tests
    """Train one model for a few hundred steps and print a sample of what it writes."""
    L.seed_everything(0)
    model = CharTransformer(d_model=128, lr=3e-3, warmup_steps=20)
    trainer = L.Trainer(max_steps=300, val_check_interval=100, limit_val_batches=10, logger=False)
    trainer.fit(model, datamodule=CharDataModule())
    codes = encode("def ")[None]
    with torch.no_grad():
        for _ in range(200):
            logits = model(codes[:, -model.hparams["block_size"] :])[:, -1]
            codes = torch.cat([codes, torch.multinomial(logits.softmax(-1), 1)], dim=1)
    print(decode(codes[0]))


if __name__ == "__main__":  # pragma: no cover
    main()
