"""``compile=True`` on CUDA: the compiled fused step gives the eager step's gradients (issue 20, item 5)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from lightning_hydro.backends import make_backend
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.stacking.stacked_state import StackedState
from tests.fusion_models import AttentionLM
from tests.helpers import seeded

pytestmark = pytest.mark.gpu


def digits_batch() -> Any:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(32, 64, generator=generator).cuda(), torch.randint(0, 10, (32,), generator=generator).cuda()


def token_batch() -> Any:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 20, (16, 13), generator=generator).cuda()
    return tokens[:, :-1], tokens[:, 1:]


MODELS = {
    "mlp": (lambda: DigitsMLP(hidden_dim=64), digits_batch),
    "transformer": (lambda: AttentionLM("encoder_is_causal", d_model=64, layers=2), token_batch),
}


def first_step(model: str, compile: bool) -> tuple[dict[str, torch.Tensor], str]:
    factory, batch = MODELS[model]
    trials = [seeded(factory, [i])[0].cuda() for i in range(4)]
    group = StackedState(nn.Module(), trials, list(range(4)))
    backend = make_backend("vmap", group, compile=compile)
    loss = backend.run("training_step", batch(), 0).loss()
    assert loss is not None
    loss.sum().backward()
    grads = {name: p.grad.clone() for name, p in group.params.items() if p.grad is not None}
    return grads, getattr(backend, "compile_failure", "")


@pytest.mark.parametrize("model", list(MODELS))
def test_the_compiled_step_on_cuda_gives_the_eager_gradients(model):
    eager, _ = first_step(model, compile=False)
    compiled, failure = first_step(model, compile=True)
    print(f"{model}: compile fell back to eager: {failure!r}" if failure else f"{model}: compiled")
    if model == "mlp":
        assert failure == ""  # the MLP compiles in one graph
    assert eager.keys() == compiled.keys()
    for name, g in eager.items():
        assert (compiled[name] - g).norm() / g.norm() <= 1e-5, name


@pytest.mark.parametrize("compile", [True, "reduce-overhead"])
def test_a_whole_step_on_cuda_trains_each_trial_as_the_eager_fit(compile):
    """The steady step as one compiled function (fused/step/whole_step.py); "reduce-overhead": one CUDA graph."""
    from torch._dynamo.utils import counters

    from lightning_hydro import FusedLightningModule
    from tests.helpers import fit_digits, make_trainer, max_state_difference

    def fit(setting: bool | str) -> FusedLightningModule:
        trials = [
            seeded(lambda lr=lr: DigitsMLP(hidden_dim=64, lr=lr, optimizer="adamw"), [i])[0]
            for i, lr in enumerate([1e-3, 3e-3, 1e-2, 3e-2])
        ]
        fused = FusedLightningModule(trials, backend="vmap", compile=setting, summary=False)  # type: ignore[arg-type]
        fit_digits(make_trainer(accelerator="gpu", max_steps=20, limit_val_batches=0, gradient_clip_val=1.0), fused)
        return fused

    eager = fit(False)
    counters.clear()
    compiled = fit(compile)
    whole = compiled._training_step.whole
    print(f"compile={compile!r}: {whole.whole_steps} whole steps; cudagraph skips {dict(counters['inductor'])}")
    assert whole.reason == ""
    assert whole.whole_steps == 19
    if compile == "reduce-overhead":
        assert counters["inductor"]["cudagraph_skips"] == 0  # every compiled graph ran as a CUDA graph
    for tid in range(4):
        assert max_state_difference(compiled.unfuse(tid).cpu(), eager.unfuse(tid).cpu()) <= 1e-5
