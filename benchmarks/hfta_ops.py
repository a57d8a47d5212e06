"""Side-by-side timing of hfta fused operators, torch's own vmap rules and a loop over trials.

For Linear, Conv2d, BatchNorm2d and two small blocks at B in {1, 4, 16}: forward + backward (with a
dense random upstream gradient) of B trials on one batch,
(a) a Python loop over B ordinary modules, (b) torch.func.vmap over the stacked state of the ordinary
module ("vmap"), (c) the same vmap over the hfta-converted module ("hfta"). "first" feeds the shared
data batch (a first layer); "inner" feeds per-trial activations in the layout the previous fused layer
returns (trial dim 1 after a convolution or norm, 0 after a Linear). Rounds are interleaved, the
median is reported, and times are also given as ratios to the loop (lower is faster).

Run: PYTHONPATH=. python benchmarks/hfta_ops.py [--repeats 9] [--threads 1] [--device cuda] [--output out.md]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro.backends.hfta import convert_to_fused


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], nn.Module]
    sample_shape: tuple[int, ...]
    in_dim: int | None  # None: shared input; else the trial dim of the per-trial input


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def conv_block() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
    )


CASES = [
    Case("Linear 784->256, first", lambda: nn.Linear(784, 256), (128, 784), None),
    Case("Linear 512->512, inner", lambda: nn.Linear(512, 512), (128, 512), 0),
    Case("Conv2d 3->64 k3 32x32, first", lambda: nn.Conv2d(3, 64, 3, padding=1), (32, 3, 32, 32), None),
    Case("Conv2d 64->64 k3 16x16, inner", lambda: nn.Conv2d(64, 64, 3, padding=1), (32, 64, 16, 16), 1),
    Case("BatchNorm2d 64 16x16, inner", lambda: nn.BatchNorm2d(64), (32, 64, 16, 16), 1),
    Case("MLP 784-256-256-10, first", mlp, (128, 784), None),
    Case("Conv-BN-ReLU x2 + MaxPool 32x32, first", conv_block, (32, 3, 32, 32), None),
]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def runners(case: Case, trials: int, device: torch.device) -> dict[str, Callable[[], None]]:
    modules = [case.make().to(device) for _ in range(trials)]
    params, buffers = stack_module_state(modules)
    native = copy.deepcopy(modules[0])
    fused = convert_to_fused(copy.deepcopy(modules[0]), modules)
    with torch.no_grad():  # a dense upstream gradient, as from the next layer (sum() would give stride 0)
        cotangents = torch.randn_like(
            torch.stack([module(torch.randn(case.sample_shape, device=device)) for module in modules])
        )
    if case.in_dim is None:
        shared = torch.randn(case.sample_shape, device=device)
        per_trial = [shared] * trials
        vmapped_input = shared
    else:
        stacked = torch.randn(trials, *case.sample_shape, device=device)
        per_trial = list(stacked.unbind(0))
        vmapped_input = stacked.movedim(0, case.in_dim).contiguous().requires_grad_()
        per_trial = [x.detach().requires_grad_() for x in per_trial]

    def loop() -> None:
        for module, x, cotangent in zip(modules, per_trial, cotangents):
            module(x).backward(cotangent)

    def over_trials(model: nn.Module) -> Callable[[], None]:
        def run() -> None:
            out = vmap(
                lambda p, b, x: functional_call(model, (p, b), (x,)),
                in_dims=(0, 0, case.in_dim),
                randomness="different",
            )(params, buffers, vmapped_input)
            out.backward(cotangents)

        return run

    return {"loop": loop, "vmap": over_trials(native), "hfta": over_trials(fused)}


def median_times(runs: dict[str, Callable[[], None]], repeats: int, device: torch.device) -> dict[str, float]:
    for run in runs.values():  # warm-up: allocator, kernel selection
        run()
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):  # interleaved, so that machine noise hits every variant alike
        for name, run in runs.items():
            synchronize(device)
            start = time.perf_counter()
            run()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--trials", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--output", help="also write the table to this markdown file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    header = "| op, input | B | loop ms | vmap ms | hfta ms | vmap/loop | hfta/loop | hfta/vmap |"
    lines = [
        f"device: {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"median of {args.repeats} interleaved rounds",
        "",
        header,
        "|" + "---|" * 8,
    ]
    print("\n".join(lines), flush=True)
    for case in CASES:
        for trials in args.trials:
            median = median_times(runners(case, trials, device), args.repeats, device)
            loop, native, fused = median["loop"], median["vmap"], median["hfta"]
            line = (
                f"| {case.name} | {trials} | {loop * 1e3:.1f} | {native * 1e3:.1f} | {fused * 1e3:.1f} | "
                f"{native / loop:.2f} | {fused / loop:.2f} | {fused / native:.2f} |"
            )
            lines.append(line)
            print(line, flush=True)
    if args.output:
        with open(args.output, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
