"""What keeping each trial's Python state costs a vectorised step (lightning_hydro/backends/step_state.py).

Around every ``vmap``/``hfta`` call the backend compares the trials' tracked attributes (only after the trials'
own code ran elsewhere), puts stand-ins for containers and differing values on the template, finds what the step
assigned, and hands each trial its rows. This times one forward+backward of ``training_step`` for B trials with
that machinery and with it replaced by a no-op, interleaved, and the machinery's own time per call (a call that
changes nothing: the steady state of a module whose step keeps no state), on three modules:

- ``digits``: the digits MLP, no Python state of its own (the common case: the cost of looking);
- ``outputs``: the same MLP keeping Lightning 2's ``training_step_outputs`` list and a step counter;
- ``blocks``: a Transformer-shaped model whose 12 blocks of the user's own classes carry ~10 plain attributes each
  (the shape of Hugging Face/timm models: many attributes to look at).

Run::

    PYTHONPATH=. python benchmarks/python_state_overhead.py --trials 16 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lightning_hydro.backends import make_backend
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.stacking.stacked_state import StackedState


class OutputsMLP(DigitsMLP):
    """Keeps its step's loss in a list and counts its steps."""

    def __init__(self) -> None:
        super().__init__(hidden_dim=64)
        self.training_step_outputs: list[torch.Tensor] = []
        self.calls = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.calls += 1
        loss = super().training_step(batch, batch_idx)
        self.training_step_outputs.append(loss)
        return loss


class Block(nn.Module):
    """A pre-norm Transformer block with the plain attributes a published block keeps."""

    def __init__(self, d: int, layer: int) -> None:
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim, self.layer_idx = d, 4, d // 4, layer
        self.scale, self.is_causal, self.use_cache, self.attn_pdrop = (d // 4) ** -0.5, True, False, 0.0
        self.activation, self.eps = "gelu", 1e-5
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        n, t, d = h.shape
        q, k, v = (
            z.reshape(n, t, self.num_heads, self.head_dim).transpose(1, 2) for z in self.qkv(self.ln1(h)).split(d, -1)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.is_causal, scale=self.scale)
        h = h + self.proj(y.transpose(1, 2).reshape(n, t, d))
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))


class BlocksLM(DigitsMLP):
    """Embedding, 12 blocks, readout; trained on random tokens."""

    def __init__(self, d: int = 32, vocab: int = 50) -> None:
        super().__init__(hidden_dim=8)
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d, i) for i in range(12)])
        self.head = nn.Linear(d, vocab)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        h = self.wte(x)
        for block in self.blocks:
            h = block(h)
        logits = self.head(h)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


class _NoState:
    """The machinery replaced by nothing: begin, collect, finish and abort do no work."""

    def begin(self, *args: Any) -> _NoState:
        return self

    def collect(self) -> tuple[torch.Tensor, ...]:
        return ()

    def finish(self, rows: Any) -> None:
        pass

    def abort(self) -> None:
        pass

    def forget(self) -> None:
        pass

    touched = False


def machinery_alone(group: StackedState, backend: Any, calls: int = 2000) -> float:
    """Seconds per call of the state machinery by itself (before, inside and after a call that changes nothing)."""
    template = backend.template()
    start = time.perf_counter()
    for _ in range(calls):
        active = backend._state.begin(template, group.modules, group.trial_ids, "training_step")
        active.collect()
        active.finish(())
    return (time.perf_counter() - start) / calls


def batch_for(model: str) -> Any:
    generator = torch.Generator().manual_seed(0)
    if model == "blocks":
        tokens = torch.randint(0, 50, (16, 33), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]
    return torch.rand(64, 64, generator=generator), torch.randint(0, 10, (64,), generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    factories = {"digits": lambda: DigitsMLP(hidden_dim=64), "outputs": OutputsMLP, "blocks": BlocksLM}
    print(f"B = {args.trials}, torch threads {args.threads}, {args.steps} steps x {args.repeats} repeats (median)")
    print("| model | backend | with state tracking ms/step | without ms/step | overhead | machinery alone us/call |")
    print("|---|---|---|---|---|---|")
    for model, factory in factories.items():
        batch = batch_for(model)
        for backend_name in ("vmap", "hfta"):
            backends = {}
            for variant in ("with", "without"):
                torch.manual_seed(0)
                group = StackedState(nn.Module(), [factory() for _ in range(args.trials)], list(range(args.trials)))
                backend = make_backend(backend_name, group)
                if variant == "without":
                    backend._state = _NoState()  # type: ignore[attr-defined,assignment]
                backends[variant] = (group, backend)
            times: dict[str, list[float]] = {"with": [], "without": []}
            for _ in range(args.repeats):
                for variant, (group, backend) in backends.items():  # interleaved, so that load hits both
                    for module in group.modules:
                        for value in vars(module).values():
                            if isinstance(value, list):
                                value.clear()
                    backend.run("training_step", batch, 0).loss().sum().backward()  # warm-up
                    start = time.perf_counter()
                    for step in range(args.steps):
                        for param in group.params.values():
                            param.grad = None
                        backend.run("training_step", batch, step).loss().sum().backward()
                    times[variant].append((time.perf_counter() - start) / args.steps)
            with_state, without = statistics.median(times["with"]), statistics.median(times["without"])
            alone = machinery_alone(*backends["with"])
            print(
                f"| {model} | {backend_name} | {1000 * with_state:.2f} | {1000 * without:.2f} | "
                f"{100 * (with_state / without - 1):+.1f}% | {1e6 * alone:.1f} |"
            )


if __name__ == "__main__":
    main()
