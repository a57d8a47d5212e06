"""A fused group against what a user would run instead, on one device (issue 22): GPU first, CPU too.

For each model and group size B, the time of one *round* (every trial takes one optimizer step), in ms:

- ``sequential``: the B trials as B plain Lightning runs one after another (one run is timed; B times that);
- ``concurrent``: B processes on the same device, each a plain Lightning run of one trial, started together,
  meeting at a barrier after warm-up and timed together (from the barrier to the last one's end); memory is what
  all of them hold together (on a GPU the device's used memory, CUDA contexts included; on a CPU the sum of the
  processes' peak resident sizes);
- ``fused-vmap``, ``fused-hfta`` (and ``-compile``: ``compile=True``; ``-graphs``: ``compile="reduce-overhead"``):
  one FusedLightningModule of the B trials in one Lightning run; ``fused-auto``: the default ``backend="auto"``,
  which runs a group of one on its own module (the ``loop`` backend) and times the others on the first batch;
- ``lightning-floor``: the raw eager step below (the same vmapped loss and foreach update) as a minimal
  LightningModule under Lightning's automatic optimization, fed as the other Lightning rows: what Lightning's own
  loop adds to the raw step, so that ``fused-vmap`` over it is the fused step's own overhead;
- hand-written floors, without Lightning: ``raw-eager`` (stack_module_state + functional_call + vmap, backward,
  a foreach optimizer update with per-trial learning rates), ``raw-compile`` (its loss under ``torch.compile``,
  the update compiled apart) and, on CUDA, ``raw-graphs`` (the whole step, update included, captured in one
  CUDA graph and replayed).

Timing: after ``--warmup`` steps, ``--steps`` steps between two synchronisations (``torch.cuda.synchronize()`` on
CUDA), so GPU times include the work, not only its launch. Peak memory: ``torch.cuda.max_memory_allocated`` over
the timed steps (CPU: the process's peak resident size, which includes the interpreter). Kernels and host
syncs per step: ``torch.profiler`` over ``--profile-steps`` more steps (CUDA: kernel launches, and the
synchronising CUDA runtime calls; CPU: the aten ops, and ``aten::_local_scalar_dense``, a value read). Data:
every Lightning row is fed the same fixed batches, each handed out whole (no per-sample collation in the training
process, as with a loader's worker processes) and pinned on CUDA; the raw floors read them from the device.

Models (the issue's; ``--small`` shrinks them to run on a CPU in minutes):

- ``mlp``: MLP 784-512x4-10, batch 256, Adam (small: 784-64x2-10, batch 64);
- ``mlp-sgd``: the same MLP with SGD, momentum 0.9. On CUDA, Adam's fused update runs eagerly under ``compile=``
  (``FusedAdamUpdate.COMPILED_ON``: compiled, it trained wrongly on an H200), so the MLP's ``-compile`` and
  ``-graphs`` rows time a split step. This MLP's whole step compiles, and was checked right on the H200;
- ``resnet18``: torchvision's ResNet-18 on 32x32 images, batch 128, SGD momentum 0.9 (small: batch 8); with
  ``--precision bf16-mixed`` as well on a GPU;
- ``transformer``: a causal Transformer LM, d_model 256, 4 layers, 4 heads, seq 128, batch 32, AdamW
  (small: d_model 64, 2 layers, seq 32, batch 8).

Run::

    python benchmarks/gpu_fusion.py                                  # every model, B = 1 4 16 64, on CUDA
    python benchmarks/gpu_fusion.py --small --models mlp --trials 1 4 --steps 10 --warmup 3   # a CPU in minutes
    python benchmarks/gpu_fusion.py --rows fused-vmap concurrent --trials 16   # pick rows

Each row is measured in its own process (a fresh CUDA context, no allocator or compile cache carried over).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap
from torch.utils.data import DataLoader, Dataset

from lightning_hydro import FusedLightningModule

MODELS = ("mlp", "mlp-sgd", "resnet18", "transformer")
ROWS = (
    "sequential",
    "concurrent",
    "fused-vmap",
    "fused-hfta",
    "fused-auto",
    "fused-vmap-compile",
    "fused-vmap-graphs",
    "fused-hfta-compile",
    "lightning-floor",
    "raw-eager",
    "raw-compile",
    "raw-graphs",
)
DEFAULT_ROWS = ROWS


# -- the trials ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    """A model's size and batch."""

    batch: int
    width: int = 512
    depth: int = 4
    seq: int = 128
    vocab: int = 256


SIZES = {
    ("mlp", False): Size(batch=256, width=512, depth=4),
    ("mlp", True): Size(batch=64, width=64, depth=2),
    ("mlp-sgd", False): Size(batch=256, width=512, depth=4),
    ("mlp-sgd", True): Size(batch=64, width=64, depth=2),
    ("resnet18", False): Size(batch=128),
    ("resnet18", True): Size(batch=8),
    ("transformer", False): Size(batch=32, width=256, depth=4, seq=128),
    ("transformer", True): Size(batch=8, width=64, depth=2, seq=32),
}


class Trial(L.LightningModule):
    """What the trials share: the loss of the network's output (``forward``), logged as a user would."""

    lr: float

    @staticmethod
    def criterion(out: Tensor, y: Tensor) -> Tensor:
        """Cross-entropy over classes (or over every position's next token)."""
        return F.cross_entropy(out.flatten(0, -2), y.flatten())

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = self.criterion(self(x), y)
        self.log("train_loss", loss)
        return loss


class MLPTrial(Trial):
    """MLP 784-width x depth-10 on flattened 28x28 inputs, cross-entropy, Adam."""

    def __init__(self, size: Size, lr: float) -> None:
        super().__init__()
        self.lr = lr
        layers: list[nn.Module] = []
        width_in = 784
        for _ in range(size.depth):
            layers += [nn.Linear(width_in, size.width), nn.ReLU()]
            width_in = size.width
        self.net = nn.Sequential(*layers, nn.Linear(width_in, 10))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class MLPSGDTrial(MLPTrial):
    """The MLP with SGD, momentum 0.9."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class ResNetTrial(Trial):
    """torchvision's resnet18(num_classes=10) on 32x32 images, cross-entropy, SGD with momentum 0.9."""

    def __init__(self, size: Size, lr: float) -> None:
        super().__init__()
        import torchvision

        self.lr = lr
        self.net = torchvision.models.resnet18(num_classes=10)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class TransformerTrial(Trial):
    """A causal Transformer LM: embedding, learned positions, pre-norm encoder layers, readout; AdamW."""

    def __init__(self, size: Size, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.embed = nn.Embedding(size.vocab, size.width)
        self.pos = nn.Parameter(torch.randn(size.seq, size.width) * 0.02)
        layer = nn.TransformerEncoderLayer(
            size.width, 4, 4 * size.width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, size.depth, enable_nested_tensor=False)
        self.readout = nn.Linear(size.width, size.vocab)

    def forward(self, x: Tensor) -> Tensor:
        h = self.encoder(self.embed(x) + self.pos[: x.size(1)], is_causal=True, mask=_causal(x.size(1), x.device))
        return self.readout(h)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def _causal(length: int, device: torch.device) -> Tensor:
    return nn.Transformer.generate_square_subsequent_mask(length, device=device)


def make_trial(model: str, size: Size, index: int) -> Trial:
    """Trial ``index`` of ``model``: the same architecture, its own learning rate and initial weights."""
    torch.manual_seed(index)
    lr = (1e-3 if model in ("mlp", "transformer") else 0.05) * (1 + 0.1 * index)
    kinds = {"mlp": MLPTrial, "mlp-sgd": MLPSGDTrial, "resnet18": ResNetTrial, "transformer": TransformerTrial}
    return kinds[model](size, lr)


def make_batches(model: str, size: Size, count: int = 8) -> list[tuple[Tensor, Tensor]]:
    """``count`` fixed random batches (no download): images, flattened images or token sequences."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(count):
        if model in ("mlp", "mlp-sgd"):
            x, y = torch.rand(size.batch, 784, generator=g), torch.randint(0, 10, (size.batch,), generator=g)
        elif model == "resnet18":
            x, y = torch.randn(size.batch, 3, 32, 32, generator=g), torch.randint(0, 10, (size.batch,), generator=g)
        else:
            x = torch.randint(0, size.vocab, (size.batch, size.seq), generator=g)
            y = torch.randint(0, size.vocab, (size.batch, size.seq), generator=g)
        batches.append((x, y))
    return batches


class _WholeBatches(Dataset):
    """The fixed batches cycled as a dataset of whole batches: ``steps`` items, each one batch."""

    def __init__(self, batches: list[tuple[Tensor, Tensor]], steps: int) -> None:
        self.batches, self.steps = batches, steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.batches[index % len(self.batches)]


class RandomBatches(L.LightningDataModule):
    """The fixed batches, cycled for as many steps as asked (a Lightning run's data).

    The loader hands out each batch whole (``batch_size=None``: no per-sample indexing and collation in the
    training process, as with a loader's worker processes), pinned on CUDA (``pin``) so that Lightning's copy to
    the device does not wait for the device's queued work: the rows then time the step, as the raw floors do,
    and not the batch's assembly (every Lightning row, fused or not, is fed the same way).
    """

    def __init__(self, batches: list[tuple[Tensor, Tensor]], steps: int, pin: bool = False) -> None:
        super().__init__()
        self.data, self.pin = _WholeBatches(batches, steps), pin

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=None, shuffle=False, pin_memory=self.pin)


# -- measuring -------------------------------------------------------------------------------------------------


@dataclass
class Measurement:
    """One row's numbers for one model and B (``ms``: one round of every trial's optimizer step)."""

    ms: float
    peak_mib: float = float("nan")
    kernels: float = float("nan")
    syncs: float = float("nan")
    note: str = ""


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux


def _profile_counts(device: torch.device, step: Callable[[], None], steps: int) -> tuple[float, float]:
    """(kernels or ops, host syncs) per step of ``step``, from torch.profiler."""
    from torch.profiler import profile

    with profile(activities=_activities(device)) as prof:
        for _ in range(steps):
            step()
        _synchronize(device)
    return _counts_of(prof.events(), device, steps)


def _activities(device: torch.device) -> list[Any]:
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])


class Window(L.Callback):
    """Times ``steps`` training steps after ``warmup`` ones between two synchronisations; then profiles some more.

    With a ``barrier`` (concurrent processes), every process waits there after its warm-up, so that their timed
    windows start together; the start and end are then wall-clock times comparable across processes.
    """

    def __init__(self, warmup: int, steps: int, profile_steps: int, barrier: Any = None) -> None:
        self.warmup, self.steps, self.profile_steps, self.barrier = warmup, steps, profile_steps, barrier
        self.batches = 0
        self.start = self.end = 0.0
        self.peak = float("nan")
        self.kernels = self.syncs = float("nan")
        self._profiler: Any = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, i: int) -> None:
        device = trainer.strategy.root_device
        if self.batches == self.warmup:
            _synchronize(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            if self.barrier is not None:
                self.barrier.wait()
            self.start = time.time() if self.barrier is not None else time.perf_counter()
        if self.batches == self.warmup + self.steps and self.profile_steps:
            from torch.profiler import profile

            self._profiler = profile(activities=_activities(device))
            self._profiler.__enter__()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        device = trainer.strategy.root_device
        self.batches += 1
        if self.batches == self.warmup + self.steps:
            _synchronize(device)
            self.end = time.time() if self.barrier is not None else time.perf_counter()
            self.peak = _peak_mib(device)
            if not self.profile_steps:
                trainer.should_stop = True
        elif self._profiler is not None and self.batches == self.warmup + self.steps + self.profile_steps:
            _synchronize(device)
            self._profiler.__exit__(None, None, None)
            self.kernels, self.syncs = _counts_of(self._profiler.events(), device, self.profile_steps)
            trainer.should_stop = True

    @property
    def ms(self) -> float:
        """Milliseconds per timed step."""
        return 1000 * (self.end - self.start) / self.steps


def _counts_of(events: Any, device: torch.device, steps: int) -> tuple[float, float]:
    if device.type == "cuda":
        kernels = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
        sync_calls = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
        syncs = sum(1 for e in events if e.name in sync_calls)
    else:
        # aten ops called from Python, not those an aten op calls in turn
        kernels = sum(1 for e in events if e.name.startswith("aten::") and not _inside_aten(e))
        syncs = sum(1 for e in events if e.name == "aten::_local_scalar_dense")
    return kernels / steps, syncs / steps


def _inside_aten(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def _trainer(args: argparse.Namespace, total: int, callbacks: list[L.Callback], precision: str) -> L.Trainer:
    return L.Trainer(
        accelerator=args.device,
        devices=1,
        max_steps=total,
        callbacks=callbacks,
        precision=precision,  # type: ignore[arg-type]
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )


def lightning_run(args: argparse.Namespace, module: L.LightningModule, precision: str, barrier: Any = None) -> Window:
    """One Lightning run of ``module``, timed by a :class:`Window`."""
    total = args.warmup + args.steps + args.profile_steps
    window = Window(args.warmup, args.steps, args.profile_steps, barrier)
    trainer = _trainer(args, total, [window], precision)
    size = SIZES[(args.model, args.small)]
    pin = args.device in ("cuda", "gpu")
    trainer.fit(module, datamodule=RandomBatches(make_batches(args.model, size), total, pin=pin))
    return window


def measure_sequential(args: argparse.Namespace, count: int, precision: str) -> Measurement:
    """One plain run of one trial, times B (the B runs are identical in cost)."""
    size = SIZES[(args.model, args.small)]
    window = lightning_run(args, make_trial(args.model, size, 0), precision)
    return Measurement(window.ms * count, window.peak, window.kernels * count, window.syncs * count, "1 run x B")


def measure_fused(args: argparse.Namespace, count: int, precision: str, row: str) -> Measurement:
    """One FusedLightningModule of the B trials (backend and compile setting from the row's name)."""
    size = SIZES[(args.model, args.small)]
    backend = "hfta" if row.startswith("fused-hfta") else "auto" if row == "fused-auto" else "vmap"
    compile_setting: bool | str = "reduce-overhead" if row.endswith("-graphs") else row.endswith("-compile")
    trials = [make_trial(args.model, size, i) for i in range(count)]
    fused = FusedLightningModule(
        trials,
        backend=backend,
        verify=False,
        summary=False,
        compile=compile_setting,  # type: ignore[arg-type]
    )
    window = lightning_run(args, fused, precision)
    note = ""
    if compile_setting:  # did the steady steps run as one compiled function, and what ran eagerly?
        note = fused.compile_report.split(": ", 1)[1]
    return Measurement(window.ms, window.peak, window.kernels, window.syncs, note)


def _concurrent_worker(args: argparse.Namespace, index: int, precision: str, barrier: Any, results: Any) -> None:
    torch.set_num_threads(args.worker_threads)
    size = SIZES[(args.model, args.small)]
    window = lightning_run(args, make_trial(args.model, size, index), precision, barrier)
    used = float("nan")
    device = torch.device(args.device if args.device != "gpu" else "cuda")
    if device.type == "cuda" and index == 0:
        free, total = torch.cuda.mem_get_info()
        used = (total - free) / 2**20
    results.put((index, window.start, window.end, window.peak, used))


def measure_concurrent(args: argparse.Namespace, count: int, precision: str) -> Measurement:
    """B processes, one trial each, timed together from the barrier after their warm-up."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    barrier, results = context.Barrier(count), context.Queue()
    workers = [
        context.Process(target=_concurrent_worker, args=(args, i, precision, barrier, results)) for i in range(count)
    ]
    for worker in workers:
        worker.start()
    rows = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    start, end = min(r[1] for r in rows), max(r[2] for r in rows)
    used = next(r[4] for r in rows if r[0] == 0)
    memory = used if args.device in ("cuda", "gpu") else sum(r[3] for r in rows)
    note = "device memory in use" if args.device in ("cuda", "gpu") else "sum of peak RSS"
    return Measurement(1000 * (end - start) / args.steps, memory, note=f"{note}; {args.worker_threads} thread(s) each")


# -- the hand-written floors -----------------------------------------------------------------------------------


class RawGroup:
    """B trials as stacked tensors and one vmapped loss, with a foreach update of each trial's optimizer kind.

    The update: SGD with momentum 0.9 (ResNet-18) or Adam/AdamW (betas 0.9/0.999, eps 1e-8, AdamW's weight
    decay 0.01), with each trial's learning rate as a ``[B]`` tensor; Adam's bias corrections from a step
    counter on the device (capturable).
    """

    def __init__(self, model: str, size: Size, count: int, device: torch.device) -> None:
        modules = [make_trial(model, size, i) for i in range(count)]
        params, buffers = stack_module_state(modules)  # type: ignore[arg-type]
        self.params = {k: v.to(device).detach().requires_grad_() for k, v in params.items()}
        self.buffers = {k: v.to(device) for k, v in buffers.items()}
        self.template = modules[0].to("meta")
        self.kind = {"mlp": "adam", "mlp-sgd": "sgd", "resnet18": "sgd", "transformer": "adamw"}[model]
        self.lrs = torch.tensor([m.lr for m in modules], device=device)
        self.step_count = torch.zeros((), device=device)
        values = list(self.params.values())
        self.state = [torch.zeros_like(p) for p in values]
        self.second = [torch.zeros_like(p) for p in values]
        self.factors = [self.lrs.view(-1, *[1] * (p.dim() - 1)) for p in values]

    def loss(self, params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        """The sum over trials of each trial's loss, one vmapped call (dropout-free models: any randomness)."""
        template = self.template

        def one(p: dict[str, Tensor], b: dict[str, Tensor]) -> Tensor:
            return template.criterion(functional_call(template, (p, b), (x,)), y)

        return vmap(one, in_dims=(0, 0), randomness="different")(params, self.buffers).sum()

    @torch.no_grad()
    def update(self, grads: list[Tensor]) -> None:
        params = list(self.params.values())
        if self.kind == "sgd":
            torch._foreach_mul_(self.state, 0.9)
            torch._foreach_add_(self.state, grads)
            torch._foreach_addcmul_(params, self.factors, self.state, value=-1)
            return
        self.step_count += 1
        if self.kind == "adamw":
            torch._foreach_mul_(params, [1 - 0.01 * f for f in self.factors])
        torch._foreach_lerp_(self.state, grads, 0.1)
        torch._foreach_mul_(self.second, 0.999)
        torch._foreach_addcmul_(self.second, grads, grads, value=0.001)
        bias1 = 1 - 0.9**self.step_count
        bias2 = (1 - 0.999**self.step_count).sqrt()
        denom = torch._foreach_sqrt(self.second)
        torch._foreach_div_(denom, bias2)
        torch._foreach_add_(denom, 1e-8)
        steps = torch._foreach_mul(self.state, [-f / bias1 for f in self.factors])
        torch._foreach_div_(steps, denom)
        torch._foreach_add_(params, steps)


class _RawUpdate(torch.optim.Optimizer):
    """The raw group's foreach update as a torch optimizer (what Lightning's automatic optimization steps)."""

    def __init__(self, group: RawGroup) -> None:
        super().__init__(list(group.params.values()), {})
        self.group = group

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        if closure is not None:
            with torch.enable_grad():
                closure()
        grads = [p.grad for p in self.group.params.values()]
        if all(g is not None for g in grads):
            self.group.update(grads)  # type: ignore[arg-type]


class LightningFloor(L.LightningModule):
    """The raw eager step (:class:`RawGroup`) under Lightning's automatic optimization: Lightning's own cost.

    The stacked parameters are made on the module's device when Lightning asks for the optimizer (after it moved
    the module there), as nn.Parameters of the module.
    """

    def __init__(self, model: str, size: Size, count: int) -> None:
        super().__init__()
        self.spec = (model, size, count)
        self.stacked = nn.ParameterList()
        self.raw: RawGroup | None = None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        group = RawGroup(*self.spec, self.device)
        group.params = {name: nn.Parameter(p.detach()) for name, p in group.params.items()}
        self.stacked.extend(group.params.values())
        self.raw = group
        return _RawUpdate(group)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        assert self.raw is not None
        x, y = batch
        return self.raw.loss(self.raw.params, x, y)


def measure_lightning_floor(args: argparse.Namespace, count: int, precision: str) -> Measurement:
    """The raw eager step of the B trials in one Lightning run (automatic optimization)."""
    size = SIZES[(args.model, args.small)]
    window = lightning_run(args, LightningFloor(args.model, size, count), precision)
    return Measurement(window.ms, window.peak, window.kernels, window.syncs)


def _batches_on(args: argparse.Namespace, device: torch.device) -> Iterator[tuple[Tensor, Tensor]]:
    size = SIZES[(args.model, args.small)]
    batches = [(x.to(device), y.to(device)) for x, y in make_batches(args.model, size)]
    while True:
        yield from batches


def measure_raw(args: argparse.Namespace, count: int, precision: str, row: str) -> Measurement:
    """The hand-written floor: eager, compiled, or (CUDA) the whole step captured in a CUDA graph."""
    device = torch.device("cuda" if args.device in ("cuda", "gpu") else "cpu")
    if row == "raw-graphs" and device.type != "cuda":
        return Measurement(float("nan"), note="CUDA graphs need CUDA")
    group = RawGroup(args.model, SIZES[(args.model, args.small)], count, device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    names = list(group.params)
    loss_fn: Callable[..., Tensor] = group.loss
    update = group.update
    if row == "raw-compile":
        loss_fn = torch.compile(group.loss)
        update = torch.compile(group.update)
    batches = _batches_on(args, device)

    def step(x: Tensor, y: Tensor) -> None:
        with autocast:
            loss = loss_fn(group.params, x, y)
        grads = torch.autograd.grad(loss, [group.params[n] for n in names])
        update(list(grads))

    run: Callable[[], None]
    if row == "raw-graphs":
        static_x, static_y = next(batches)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm-up on a side stream, as torch.cuda.graphs asks
                step(static_x, static_y)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(static_x, static_y)

        def run() -> None:
            x, y = next(batches)
            static_x.copy_(x)
            static_y.copy_(y)
            graph.replay()

    else:

        def run() -> None:
            step(*next(batches))

    for _ in range(args.warmup):
        run()
    _synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        run()
    _synchronize(device)
    ms = 1000 * (time.perf_counter() - start) / args.steps
    peak = _peak_mib(device)
    kernels, syncs = _profile_counts(device, run, args.profile_steps) if args.profile_steps else (float("nan"),) * 2
    return Measurement(ms, peak, kernels, syncs)


# -- one cell per process, the table -----------------------------------------------------------------------------


def measure(args: argparse.Namespace, row: str, count: int, precision: str) -> Measurement:
    """One cell of the table (in this process)."""
    torch.set_num_threads(args.threads)
    if row == "sequential":
        return measure_sequential(args, count, precision)
    if row == "concurrent":
        return measure_concurrent(args, count, precision)
    if row.startswith("fused-"):
        return measure_fused(args, count, precision, row)
    if row == "lightning-floor":
        return measure_lightning_floor(args, count, precision)
    return measure_raw(args, count, precision, row)


def _cell_in_subprocess(args: argparse.Namespace, row: str, count: int, precision: str) -> Measurement:
    command = [
        sys.executable,
        __file__,
        "--cell",
        json.dumps({"row": row, "count": count, "precision": precision, "model": args.model}),
        *args.passthrough,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.cell_timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("CELL ")]
    if done.returncode != 0 or not lines:
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1][:120]
        return Measurement(float("nan"), note=f"failed: {reason}")
    return Measurement(**json.loads(lines[-1][5:]))


def table(args: argparse.Namespace) -> list[str]:
    """The markdown table, one line per (model, precision, B, row), printed as measured."""
    device = "cuda" if args.device in ("cuda", "gpu") else "cpu"
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    lines = [
        f"Device: {name}, torch {torch.__version__}, Lightning {L.__version__}, {date.today().isoformat()}; "
        f"{args.steps} timed steps after {args.warmup} warm-up steps, synchronised; "
        f"{'small sizes; ' if args.small else ''}{args.threads} torch thread(s) per process.",
        "",
        "| model | precision | B | row | ms per round | peak MiB | kernels (CPU: ops) / step | host syncs / step "
        "| note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for model in args.models:
        args.model = model
        for precision in args.precision:
            if precision == "bf16-mixed" and model != "resnet18":
                continue
            for count in args.trials:
                for row in args.rows:
                    if row == "concurrent" and count > args.max_processes:
                        continue
                    cell = _cell_in_subprocess(args, row, count, precision)
                    line = (
                        f"| {model} | {precision} | {count} | {row} | {cell.ms:.2f} | {cell.peak_mib:.0f} | "
                        f"{cell.kernels:.0f} | {cell.syncs:.1f} | {cell.note} |"
                    )
                    lines.append(line)
                    print(line, flush=True)
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--trials", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS), choices=ROWS)
    parser.add_argument("--precision", nargs="+", default=["32-true", "bf16-mixed"])
    parser.add_argument("--small", action="store_true", help="small models and batches (a CPU run)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--profile-steps", type=int, default=5, help="steps profiled for kernels and syncs (0: none)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads per process")
    parser.add_argument("--max-processes", type=int, default=64, help="largest B run as concurrent processes")
    parser.add_argument("--cell-timeout", type=int, default=1800)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/gpu_fusion.md"))
    parser.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    if args.cell is not None:  # a child: one cell, printed as JSON
        cell = json.loads(args.cell)
        args.model = cell["model"]
        args.worker_threads = max(1, args.threads // max(1, cell["count"]))
        result = measure(args, cell["row"], cell["count"], cell["precision"])
        print("CELL " + json.dumps(asdict(result)), flush=True)
        return
    args.passthrough = _without_cell(args.passthrough)
    lines = table(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/gpu_fusion.py " + " ".join(args.passthrough)
    args.output.write_text(f"Command: `{command}`\n\n" + "\n".join(lines) + "\n")


def _without_cell(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--cell":
            skip = True
            continue
        out.append(arg)
    return out


if __name__ == "__main__":
    main()
