"""Does ``torch.compile`` compute the fused optimizer updates as they run eagerly on this device? (issue 22)

On an H200 (torch 2.11.0+cu130, 2026-11-27) Adam's and AdamW's compiled update trained wrongly. SGD with momentum
was right. So ``FusedAdamUpdate.COMPILED_ON`` keeps Adam's update eager on CUDA. This script finds out, on the
device it runs on, which updates compile right and which of inductor's settings fixes the others. It needs no
Lightning: for each update it runs ``--steps`` steps of the update's device work twice from the same state, once
compiled and once eagerly. The gradients are random, and some rows are skipped now and then, as diverged trials are.
It prints the largest relative difference over the parameters, the optimizer state and the counters, for each
variant:

- ``default``: as the library compiles it;
- ``no-loaf``: ``torch._inductor.config.loop_ordering_after_fusion = False``. Inductor's loop reordering after
  fusion is where the whole AdamW step's compile failed on the H200, with an ``AssertionError`` in
  ``reorder_loops_by_dep_pair``;
- ``no-lerp``: Adam's first moment written as a multiply and an ``addcmul`` while compiling, in place of
  ``torch._foreach_lerp_``, a pattern whose reads inductor has mis-planned before;
- ``both``.

A variant at float rounding (<= 1e-5) where ``default`` is not is the candidate fix. Then the update compiles with
it, and ``FusedAdamUpdate.COMPILED_ON`` adds the device once ``pytest -m gpu tests/gpu/test_gpu_compile.py``
passes, including its strict xfail.

Run::

    python benchmarks/compiled_update_check.py                 # on CUDA if present, else the CPU
    python benchmarks/compiled_update_check.py --device cpu --small
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from lightning_hydro.fused.step.fused_update import FusedUpdate
from lightning_hydro.fused.step.select_update import select_fused_update

OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "sgd-momentum": (torch.optim.SGD, {"momentum": 0.9, "weight_decay": 1e-3, "dampening": 0.1}),
    "sgd-nesterov": (torch.optim.SGD, {"momentum": 0.9, "nesterov": True}),
    "adam": (torch.optim.Adam, {}),
    "adamw": (torch.optim.AdamW, {"weight_decay": 0.01}),
    "adam-amsgrad": (torch.optim.Adam, {"amsgrad": True, "weight_decay": 1e-3}),
}
VARIANTS = ("default", "no-loaf", "no-lerp", "both")


def _lerp_as_mul_add(tensors: Any, ends: Any, weights: Any) -> None:
    """``torch._foreach_lerp_`` with tensor weights, as ``a * (1 - w) + b * w``."""
    torch._foreach_mul_(tensors, [1 - w for w in weights])
    torch._foreach_addcmul_(tensors, ends, weights)


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """Inductor's settings and the update's code for one variant, while its calls compile and run."""
    with contextlib.ExitStack() as stack:
        if name in ("no-loaf", "both"):
            stack.enter_context(torch._inductor.config.patch(loop_ordering_after_fusion=False))
        if name in ("no-lerp", "both"):
            real = torch._foreach_lerp_
            torch._foreach_lerp_ = _lerp_as_mul_add  # type: ignore[assignment]
            stack.callback(setattr, torch, "_foreach_lerp_", real)
        yield


def make_update(kind: str, shapes: list[tuple[int, ...]], rows: int, device: str) -> tuple[FusedUpdate, list[Any]]:
    """A fused update of ``rows`` trials' optimizers over stacked parameters of ``shapes``, seeded."""
    generator = torch.Generator().manual_seed(0)
    stacked = [nn.Parameter(torch.randn(rows, *s, generator=generator).to(device)) for s in shapes]
    trials = [[nn.Parameter(p.detach()[r].clone()) for p in stacked] for r in range(rows)]
    make, settings = OPTIMIZERS[kind]
    lrs = [1e-3 * (1 + r) for r in range(rows)]
    optimizers = [make(t, lr=lr, **settings) for lr, t in zip(lrs, trials)]
    update = select_fused_update(optimizers, trials, stacked)
    if isinstance(update, str):
        raise RuntimeError(update)
    return update, [o.param_groups for o in optimizers]


def run_steps(kind: str, shapes: list[tuple[int, ...]], rows: int, device: str, steps: int, step: Callable) -> list:
    """``steps`` updates with seeded gradients (rows skipped now and then); the tensors the update keeps."""
    update, groups = make_update(kind, shapes, rows, device)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for i in range(steps):
            for p in update.params:
                p.grad = torch.randn(p.shape, generator=generator).to(device)
            skip = torch.zeros(rows, dtype=torch.bool)
            skip[i % rows] = i % 3 == 1  # a row skipped every third step, its first step among them
            skip = skip.to(device)
            active = list(range(len(update.params)))
            prepared = update.prepare(groups, active)
            step(update, update.by_part(active, [p.grad for p in update.params]), skip, prepared)
            update.finish(active, prepared)
    kept = [p.detach().clone() for p in update.params]
    kept += [t.clone() for state in update.state for t in state.values()]
    kept += [t.clone() for t in vars(update).values() if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return kept


def largest_difference(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """The largest ``||got - want|| / ||want||`` over the tensors (NaN anywhere: inf)."""
    worst = 0.0
    for a, b in zip(got, want, strict=True):
        a, b = a.double(), b.double()
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            return float("inf")
        worst = max(worst, float((a - b).norm() / b.norm().clamp_min(1e-30)))
    return worst


def check(kind: str, shapes: list[tuple[int, ...]], rows: int, device: str, steps: int, name: str) -> str:
    """One row of the table: ``kind`` compiled under variant ``name`` against eager."""

    def eager(update: FusedUpdate, grads: Any, skip: torch.Tensor, prepared: Any) -> None:
        update.device_step(grads, skip, prepared)

    def device_step(update: FusedUpdate, grads: Any, skip: torch.Tensor, prepared: Any) -> None:
        update.device_step(grads, skip, prepared)

    want = run_steps(kind, shapes, rows, device, steps, eager)
    torch._dynamo.reset()
    compiled = torch.compile(device_step, fullgraph=True, dynamic=False)
    start = time.perf_counter()
    try:
        with variant(name):
            got = run_steps(kind, shapes, rows, device, steps, compiled)
    except Exception as err:  # a failed compile is a result of its own here
        first = (str(err).strip().splitlines() or [""])[0][:80]
        return f"| {kind} | {name} | failed: {type(err).__name__}: {first} | |"
    seconds = time.perf_counter() - start
    difference = largest_difference(got, want)
    verdict = "same" if difference <= 1e-5 else "**differs**"
    return f"| {kind} | {name} | {difference:.2e} ({verdict}) | {seconds:.1f} |"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=OPTIMIZERS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--small", action="store_true", help="small parameters (a CPU run)")
    args = parser.parse_args(argv)
    # an MLP's layers (784-512-512-10), or a small one
    shapes = [(32, 16), (32,), (10, 32), (10,)] if args.small else [(512, 784), (512,), (512, 512), (512,), (10, 512)]
    lines = [
        f"Device: {args.device} ({torch.cuda.get_device_name(0) if args.device == 'cuda' else 'CPU'}), torch "
        f"{torch.__version__}, {time.strftime('%Y-%m-%d')}; B = {args.rows}, {args.steps} steps, parameters "
        f"{shapes}; largest relative difference, compiled vs eager, over parameters, state and counters.",
        "",
        "| update | variant | compiled vs eager | seconds (compile included) |",
        "|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for kind in args.optimizers:
        for name in args.variants:
            if name in ("no-lerp", "both") and not kind.startswith("adam"):
                continue  # no lerp in SGD's update
            line = check(kind, shapes, args.rows, args.device, args.steps, name)
            print(line, flush=True)
            lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
