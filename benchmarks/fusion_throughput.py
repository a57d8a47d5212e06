"""Training throughput of fused trials versus a loop and versus separate runs, measured side by side.

``--model mlp`` (the digits MLP, issue 2): for each width and number of trials B, one process measures
(median over repeats, after warm-up):

- ``fused[<backend>]``: FusedLightningModule in a Lightning Trainer, per backend;
- ``separate``: B ordinary Trainer runs one after another (each trial's own LightningModule);
- ``raw vmap``: a hand-written torch training loop (stack_module_state + functional_call + vmap, per-trial
  SGD learning rates as a [B] tensor): no Lightning at all, the floor for FusedLightningModule's overhead;
- ``lightning vmap``: the same vmapped step inside a minimal hand-written LightningModule (manual
  optimization): Lightning's own per-step cost, to tell it apart from FusedLightningModule's;
- ``lightning vmap (automatic)``: the same again with Lightning's automatic optimization (the step returns the
  summed loss; a foreach SGD with the per-trial learning rates as a [B] tensor is the optimizer), which is what
  FusedLightningModule runs under: the closure, backward, clipping and optimizer hooks Lightning adds per step.

``--model template_mnist`` (issue 11): lightning-hydra-template's MNISTLitModule shape at B = 4 and 16, with
torchmetrics in every step: the backend ``auto`` picks vs each backend vs separate runs (see fusion_template.py).

``--model resnet18`` (torchvision's ResNet-18 on 32x32 synthetic images) and ``--model transformer``
(a small Transformer encoder LM on random tokens) (issue 6): time per step and peak memory of each
backend (vmap, hfta, loop), and each as a ratio to ``loop``.

Every number is the steady-state time of one optimizer step of the whole group (median of the per-step
intervals after warm-up steps), so Trainer start-up is excluded (reported separately for `separate`). On CUDA
each interval starts and ends with ``torch.cuda.synchronize()`` (else it would time kernel launches only);
``benchmarks/gpu_fusion.py`` times windows of many steps between two synchronisations instead.
Peak memory is the allocator's peak on a GPU, and on the CPU the bytes a step holds (parameters,
gradients, optimizer state, activations saved for backward; see lightning_hydro/sweeper/planning/memory_probe.py).

Run::

    python benchmarks/fusion_throughput.py                       # the issue's table: MLP, widths 64/256
    python benchmarks/fusion_throughput.py --trials 1 4 16 --widths 64 --steps 40 --repeats 2   # quick
    python benchmarks/fusion_throughput.py --model resnet18      # backends on ResNet-18 (and transformer)
    python benchmarks/fusion_throughput.py --model compile       # eager vs compile=True (see compile_step.py)
    python benchmarks/fusion_throughput.py --model template_mnist  # the template module: auto vs loop vs separate
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from torch.utils.data import DataLoader, TensorDataset

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from lightning_hydro.sweeper.planning.memory_probe import measure_fused_step


class RandomData(L.LightningDataModule):
    """Fixed random inputs and labels (images or token sequences), no download."""

    def __init__(self, kind: str, batch_size: int = 32, batches: int = 16) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        n = batch_size * batches
        if kind == "images":
            x = torch.randn(n, 3, 32, 32, generator=g)
            y = torch.randint(0, 10, (n,), generator=g)
        else:
            x = torch.randint(0, 96, (n, 64), generator=g)
            y = torch.randint(0, 96, (n, 64), generator=g)
        self.data, self.batch_size = TensorDataset(x, y), batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size)


class ResNetTrial(L.LightningModule):
    """torchvision's resnet18(num_classes=10), trained with SGD + momentum."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        import torchvision

        self.lr = lr
        self.net = torchvision.models.resnet18(num_classes=10)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class TransformerTrial(L.LightningModule):
    """A small Transformer encoder LM: embedding, 2 pre-norm encoder layers (causal), readout."""

    def __init__(self, lr: float = 1e-3, d_model: int = 128, vocab: int = 96) -> None:
        super().__init__()
        self.lr = lr
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(64, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, 4, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.readout = nn.Linear(d_model, vocab)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        mask = nn.Transformer.generate_square_subsequent_mask(x.size(1), device=x.device)
        h = self.encoder(self.embed(x) + self.pos[: x.size(1)], mask=mask, is_causal=True)
        return F.cross_entropy(self.readout(h).flatten(0, 1), y.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def time_backends(
    model: str, count: int, backends: list[str], steps: int, device: str
) -> dict[str, tuple[float, float]]:
    """{backend: (seconds per step, peak bytes)} for ``count`` trials of ``model`` fused."""
    out = {}
    for backend in backends:
        torch.manual_seed(0)
        trials = [
            ResNetTrial(0.01 * (i + 1)) if model == "resnet18" else TransformerTrial(1e-4 * (i + 1))
            for i in range(count)
        ]
        data = RandomData("images" if model == "resnet18" else "tokens")
        measured = measure_fused_step(trials, data, steps=steps, backend=backend, accelerator=device)
        out[backend] = (measured.step_seconds, measured.peak_bytes)
    return out


def model_table(args: argparse.Namespace) -> list[str]:
    """The issue-6 table: per backend, ms per step and peak MiB, and ratios to the loop backend."""
    backends = args.backends if "loop" in args.backends else [*args.backends, "loop"]
    fused = [b for b in backends if b != "loop"]
    header = (
        f"| model | B | {' | '.join(f'{b} ms/step' for b in backends)} | "
        f"{' | '.join(f'{b} peak MiB' for b in backends)} | {' | '.join(f'{b} speed-up vs loop' for b in fused)} |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    print("\n".join(lines), flush=True)
    for count in args.trials:
        runs = [time_backends(args.model, count, backends, args.steps, args.device) for _ in range(args.repeats)]
        ms = {b: 1000 * statistics.median(r[b][0] for r in runs) for b in backends}
        mib = {b: max(r[b][1] for r in runs) / 2**20 for b in backends}
        speedups = [ms["loop"] / ms[b] for b in fused]
        row = (
            f"| {args.model} | {count} | {' | '.join(f'{ms[b]:.1f}' for b in backends)} | "
            f"{' | '.join(f'{mib[b]:.0f}' for b in backends)} | "
            f"{' | '.join(f'{speedup:.2f}x' for speedup in speedups)} |"
        )
        lines.append(row)
        print(row, flush=True)
    return lines


# what the step times are measured with: wall time, or (``--clock thread``, for a machine shared with other work)
# the CPU time of this thread, which other processes' load disturbs less (one torch thread: the step runs here)
CLOCK = {"now": time.perf_counter}


class StepTimer(L.Callback):
    """Records the wall time of every training batch after the first `warmup` ones; stops after `steps`.

    It counts batches itself: with manual optimization and no optimizer, Lightning's global_step stays 0. On
    CUDA it synchronises before starting and before stopping the clock, so that an interval is the batch's
    whole work, not the launch of its kernels.
    """

    def __init__(self, warmup: int, steps: int) -> None:
        self.warmup, self.steps = warmup, steps
        self.times: list[float] = []
        self.batches = 0
        self._last = 0.0

    @staticmethod
    def _synchronize(trainer: L.Trainer) -> None:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._synchronize(trainer)
        self._last = CLOCK["now"]()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._synchronize(trainer)
        self.batches += 1
        if self.batches > self.warmup:
            self.times.append(CLOCK["now"]() - self._last)
        if self.batches >= self.steps:
            trainer.should_stop = True


def trainer_for(steps: int, device: str, callbacks: list[L.Callback]) -> L.Trainer:
    return L.Trainer(
        max_steps=steps,
        accelerator=device,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=callbacks,
    )


def make_trials(count: int, width: int) -> list[DigitsMLP]:
    return [DigitsMLP(hidden_dim=width, lr=0.01 * (1 + i), momentum=0.9) for i in range(count)]


def time_fused(count: int, width: int, backend: str, steps: int, warmup: int, device: str) -> float:
    timer = StepTimer(warmup, steps)
    fused = FusedLightningModule(make_trials(count, width), backend=backend, summary=False, verify=False)
    trainer_for(steps, device, [timer]).fit(fused, datamodule=DigitsDataModule())
    return statistics.median(timer.times)


def time_separate(count: int, width: int, steps: int, warmup: int, device: str, measured: int) -> tuple[float, float]:
    """(per group step, start-up per run): `measured` runs are timed and scaled to `count` (they are identical)."""
    per_step, startup = [], []
    for trial in make_trials(min(count, measured), width):
        timer = StepTimer(warmup, steps)
        start = time.perf_counter()
        trainer_for(steps, device, [timer]).fit(trial, datamodule=DigitsDataModule())
        total = time.perf_counter() - start
        per_step.append(statistics.median(timer.times))
        startup.append(total - sum(timer.times) * steps / max(1, len(timer.times)))
    return statistics.mean(per_step) * count, statistics.mean(startup)


def raw_vmap_step(count: int, width: int, device: str) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A hand-written fused training step: vmap over stacked MLPs, SGD with momentum and per-trial lr."""
    models = [DigitsMLP(hidden_dim=width) for _ in range(count)]
    params, _ = stack_module_state(models)  # the MLP has no buffers
    params = {k: v.to(device).requires_grad_() for k, v in params.items()}
    template = models[0].to("meta")
    lrs = torch.tensor([0.01 * (1 + i) for i in range(count)], device=device)
    momentum = {k: torch.zeros_like(v) for k, v in params.items()}

    def loss_of(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(template, p, (x,)), y)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        losses = vmap(loss_of, in_dims=(0, None, None))(params, x, y)
        grads = torch.autograd.grad(losses.sum(), list(params.values()))
        with torch.no_grad():
            for (name, p), g in zip(params.items(), grads):
                buf = momentum[name].mul_(0.9).add_(g)
                p.sub_(lrs.view(-1, *[1] * (p.dim() - 1)) * buf)

    return step


def time_raw(count: int, width: int, steps: int, warmup: int, device: str) -> float:
    dm = DigitsDataModule()
    dm.setup("fit")
    step = raw_vmap_step(count, width, device)
    times: list[float] = []
    done = 0
    while done < steps:
        for x, y in dm.train_dataloader():  # the same data pipeline as the Trainer runs
            start = CLOCK["now"]()
            step(x.to(device), y.to(device))
            if device == "cuda":
                torch.cuda.synchronize()
            if done >= warmup:
                times.append(CLOCK["now"]() - start)
            done += 1
            if done >= steps:
                break
    return statistics.median(times)


class LightningVmap(L.LightningModule):
    """The raw vmapped step inside a minimal LightningModule (manual optimization): Lightning's own cost."""

    def __init__(self, count: int, width: int) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.count, self.width = count, width
        self._step: Callable[[torch.Tensor, torch.Tensor], None] | None = None

    def training_step(self, batch: Any, batch_idx: int) -> None:
        if self._step is None:
            self._step = raw_vmap_step(self.count, self.width, self.device.type)
        self._step(*batch)

    def configure_optimizers(self) -> None:
        return None


def time_lightning_vmap(count: int, width: int, steps: int, warmup: int, device: str) -> float:
    timer = StepTimer(warmup, steps)
    trainer_for(steps, device, [timer]).fit(LightningVmap(count, width), datamodule=DigitsDataModule())
    return statistics.median(timer.times)


class VmapSGD(torch.optim.Optimizer):
    """SGD with momentum 0.9 over stacked [B, ...] parameters, a [B] learning rate per trial, as foreach calls."""

    def __init__(self, params: Any, lrs: torch.Tensor) -> None:
        super().__init__(params, {})
        self.lrs = lrs
        self.buffers: list[torch.Tensor] | None = None

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        if closure is not None:
            with torch.enable_grad():
                closure()
        params = [p for group in self.param_groups for p in group["params"]]
        grads = [p.grad for p in params]
        if self.buffers is None:
            self.buffers = [torch.zeros_like(p) for p in params]
        torch._foreach_mul_(self.buffers, 0.9)
        torch._foreach_add_(self.buffers, grads)
        factors = [self.lrs.view(-1, *[1] * (p.dim() - 1)) for p in params]
        torch._foreach_addcmul_(params, factors, self.buffers, value=-1)


class LightningVmapAutomatic(L.LightningModule):
    """The raw vmapped loss under Lightning's automatic optimization: the floor of FusedLightningModule's setting."""

    def __init__(self, count: int, width: int) -> None:
        super().__init__()
        models = [DigitsMLP(hidden_dim=width) for _ in range(count)]
        params, _ = stack_module_state(models)
        self.names = list(params)
        self.stacked = nn.ParameterList([nn.Parameter(v) for v in params.values()])
        self.__dict__["template"] = models[0].to("meta")  # not a submodule: .to() must not move it
        self.lrs = torch.tensor([0.01 * (1 + i) for i in range(count)])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        params = dict(zip(self.names, self.stacked))

        def loss_of(p: dict[str, torch.Tensor]) -> torch.Tensor:
            return F.cross_entropy(functional_call(self.template, p, (x,)), y)

        return vmap(loss_of)(params).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return VmapSGD(self.stacked.parameters(), self.lrs.to(self.device))


def time_lightning_vmap_automatic(count: int, width: int, steps: int, warmup: int, device: str) -> float:
    timer = StepTimer(warmup, steps)
    module = LightningVmapAutomatic(count, width)
    trainer_for(steps, device, [timer]).fit(module, datamodule=DigitsDataModule())
    return statistics.median(timer.times)


def _model_report(args: argparse.Namespace) -> str:
    """The report of ``--model compile``, ``template_mnist``, ``resnet18`` or ``transformer``."""
    if args.model == "compile":
        from compile_step import compile_table, counters_table  # benchmarks/ is on sys.path when this file runs

        trials = args.trials if args.trials != [1, 4, 16, 64] else [4, 16, 64]
        cases = [("digits", width, count) for width in args.widths for count in trials]
        cases += [("template", 64, 16), ("template_module", 64, 16), ("transformer", 64, 4)]
        lines = [
            f"Device: {args.device}, torch threads: {args.threads}, torch {torch.__version__}, {args.steps} steps "
            f"({args.warmup} warm-up), median of {args.repeats} repeats; backend vmap, eager vs compile=True (split "
            "and whole step).",
            "",
            *compile_table(cases, args.steps, args.warmup, args.repeats, args.device),
            "",
            "A step that reads batch_idx, self.global_step and self.current_epoch (same runs' settings):",
            "",
            *counters_table(args.widths[0], 16, args.steps, args.warmup, args.repeats, args.device),
        ]
        return "\n".join(lines) + "\n"
    if args.backends == ["vmap", "loop"]:
        args.backends = ["vmap", "hfta", "loop"]
    if args.model == "template_mnist":
        from fusion_template import template_table  # next to this file (on sys.path when run as a script)

        return "\n".join(template_table(args, StepTimer)) + "\n"
    lines = [
        f"Device: {args.device}, torch threads: {args.threads}, {args.steps} steps (the first excluded), median "
        f"of {args.repeats} repeats.",
        "",
        *model_table(args),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="mlp", choices=["mlp", "resnet18", "transformer", "template_mnist", "compile"]
    )
    parser.add_argument("--trials", type=int, nargs="+", default=None, help="default: 1 4 16 64 (template: 4 16)")
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--backends", nargs="+", default=["vmap", "loop"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--separate-runs", type=int, default=4, help="separate runs timed per cell (then scaled)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument(
        "--clock",
        choices=["wall", "thread"],
        default="wall",
        help="thread: this thread's CPU time (with --threads 1, less disturbed by other processes' load)",
    )
    parser.add_argument("--output", type=Path, default=None, help="default: benchmarks/results/fusion_<model>.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    CLOCK["now"] = time.thread_time if args.clock == "thread" else time.perf_counter
    output = args.output or Path(f"benchmarks/results/fusion_{args.model}.md")
    if args.trials is None:
        args.trials = [4, 16] if args.model == "template_mnist" else [1, 4, 16, 64]
    if args.model != "mlp":
        text = _model_report(args)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        return text

    columns = [
        *(f"fused[{b}]" for b in args.backends),
        "separate",
        "raw vmap",
        "lightning vmap",
        "lightning vmap (automatic)",
    ]
    header = (
        f"| width | B | {' | '.join(f'{c} ms/step' for c in columns)} | vmap speed-up vs loop "
        "| vmap speed-up vs separate | overhead vs raw | overhead vs lightning vmap "
        "| overhead vs lightning vmap (automatic) |"
    )
    lines = [
        f"Device: {args.device}, torch threads: {args.threads}, {args.steps} steps ({args.warmup} warm-up), median of "
        f"{args.repeats} repeats; ms per optimizer step of the whole group of B trials"
        f"{' (thread CPU time)' if args.clock == 'thread' else ''}.",
        "",
        header,
        "|" + "---|" * (header.count("|") - 1),
    ]
    print("\n".join(lines), flush=True)
    for width in args.widths:
        for count in args.trials:
            cells: dict[str, list[float]] = {c: [] for c in columns}
            startup: list[float] = []
            for _ in range(args.repeats):
                for backend in args.backends:
                    cells[f"fused[{backend}]"].append(
                        time_fused(count, width, backend, args.steps, args.warmup, args.device)
                    )
                per_step, start = time_separate(count, width, args.steps, args.warmup, args.device, args.separate_runs)
                cells["separate"].append(per_step)
                startup.append(start)
                cells["raw vmap"].append(time_raw(count, width, args.steps, args.warmup, args.device))
                cells["lightning vmap"].append(time_lightning_vmap(count, width, args.steps, args.warmup, args.device))
                cells["lightning vmap (automatic)"].append(
                    time_lightning_vmap_automatic(count, width, args.steps, args.warmup, args.device)
                )
            ms = {c: 1000 * statistics.median(v) for c, v in cells.items()}
            fused = ms.get("fused[vmap]", ms[columns[0]])
            vs_loop = f"{ms['fused[loop]'] / fused:.2f}x" if "fused[loop]" in ms else "(loop not run)"
            row = (
                f"| {width} | {count} | {' | '.join(f'{ms[c]:.2f}' for c in columns)} | "
                f"{vs_loop} | {ms['separate'] / fused:.2f}x | "
                f"{100 * (fused / ms['raw vmap'] - 1):+.0f}% | {100 * (fused / ms['lightning vmap'] - 1):+.0f}% | "
                f"{100 * (fused / ms['lightning vmap (automatic)'] - 1):+.0f}% |"
            )
            lines.append(row)
            print(row, flush=True)
    lines += [
        "",
        f"`separate` also pays {statistics.median(startup):.2f} s of Trainer start-up per run (not in its column).",
    ]
    text = "\n".join(lines) + "\n"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    print(lines[-1])
    return text


if __name__ == "__main__":
    main()
