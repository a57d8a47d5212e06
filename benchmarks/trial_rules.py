"""What the trial rules cost and save in a fused vmap step: with them against vmap's own batching, side by side.

The rules (``lightning_hydro/backends/trial_ops/``) replace vmap's batching of attention, normalisation, linear
layers and convolutions while a fused step runs. This times one forward+backward of the vmap backend on the
first batch, B trials, with the rules installed (as the backend runs) and with the rules switched off (vmap's
own batching, as before issue 20), and the loop backend (each trial's own step, the arithmetic the rules
reproduce), interleaved, after warm-up; the median of ``--repeats`` rounds. Models: the
digits MLP, a BatchNorm CNN, and a causal Transformer block (``nn.TransformerEncoderLayer``, d_model 64).

    python benchmarks/trial_rules.py --trials 8 --repeats 15
    python benchmarks/trial_rules.py --trials 8 --repeats 15 --precision bf16-mixed
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' model zoo

from lightning_hydro.backends import LoopBackend, vmap_backend
from lightning_hydro.backends.base import Backend
from lightning_hydro.backends.vmap_backend import VmapBackend
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.stacking.stacked_state import StackedState
from tests.fusion_models import AttentionLM, NormNet


def digits(generator: torch.Generator) -> Any:
    return torch.rand(64, 64, generator=generator), torch.randint(0, 10, (64,), generator=generator)


def tokens(generator: torch.Generator) -> Any:
    batch = torch.randint(1, 20, (16, 33), generator=generator)
    return batch[:, :-1], batch[:, 1:]


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[torch.Generator], Any]]] = {
    "MLP (digits, hidden 64)": (lambda: DigitsMLP(hidden_dim=64), digits),
    "BatchNorm CNN (digits)": (lambda: NormNet("batch"), digits),
    "Transformer block (causal, d_model 64)": (lambda: AttentionLM("encoder_is_causal", d_model=64), tokens),
}


def step_seconds(backend: Backend, batch: Any, rules: bool, repeats: int, autocast: bool) -> list[float]:
    original = vmap_backend.trial_functional
    if not rules:
        vmap_backend.trial_functional = lambda **_: contextlib.nullcontext()  # type: ignore[assignment]
    try:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = backend.run("training_step", batch, 0).loss()
            assert loss is not None
            loss.sum().backward()
            times.append(time.perf_counter() - start)
        return times
    finally:
        vmap_backend.trial_functional = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--precision", choices=["32", "bf16-mixed"], default="32", help="bf16-mixed: CPU autocast")
    args = parser.parse_args()
    autocast = args.precision == "bf16-mixed"
    torch.set_num_threads(1)
    rows = []
    for name, (factory, data) in MODELS.items():
        trials = []
        for seed in range(args.trials):
            torch.manual_seed(seed)
            trials.append(factory())
        group = StackedState(nn.Module(), trials, list(range(args.trials)))
        backend, loop = VmapBackend(group), LoopBackend(group)
        batch = data(torch.Generator().manual_seed(0))
        for rules in (True, False):  # warm-up
            step_seconds(backend, batch, rules, 3, autocast)
        step_seconds(loop, batch, True, 3, autocast)
        with_rules, without, alone = [], [], []
        runs = [(with_rules, backend, True), (without, backend, False), (alone, loop, True)]
        for round_ in range(args.repeats):  # interleaved, each first in turn: load changes hit all alike
            for times, runner, rules in runs[round_ % 3 :] + runs[: round_ % 3]:
                times += step_seconds(runner, batch, rules, 1, autocast)
        a, b, c = (1000 * statistics.median(t) for t in (with_rules, without, alone))
        rows.append(f"| {name} | {args.trials} | {a:.2f} | {b:.2f} | {b / a:.2f}x | {c:.2f} |")
    print(
        f"torch {torch.__version__}, CPU, 1 thread, precision {args.precision}, forward+backward of one fused step, "
        f"median of {args.repeats}\n"
        "| model | trials | with the rules (ms) | vmap's own batching (ms) | speed-up | loop (ms) |\n"
        "|---|---|---|---|---|---|"
    )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
