"""vmap, hfta and loop on CUDA equal separate training in float32 with TF32 off (issue 20, item 5).

First-step gradients of each fused trial against the same trial trained alone on the GPU, relative over all its
parameters: an MLP, a BatchNorm CNN and a Transformer (2-layer nn.TransformerEncoder, causal).
"""

from __future__ import annotations

import pytest
import torch

from lightning_hydro.demos import DigitsMLP
from tests.fusion_models import AttentionLM, NormNet, fused_and_separate_first_gradients, token_loader
from tests.helpers import fit_digits

pytestmark = pytest.mark.gpu


def fit_tokens(trainer, module) -> None:
    trainer.fit(module, train_dataloaders=token_loader())


MODELS = {
    "mlp": (lambda lr: DigitsMLP(hidden_dim=64, lr=lr), fit_digits),
    "batchnorm_cnn": (lambda lr: NormNet("batch", lr=lr), fit_digits),
    "transformer": (lambda lr: AttentionLM("encoder_is_causal", lr=lr, d_model=64, layers=2), fit_tokens),
}


@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop"])
@pytest.mark.parametrize("model", list(MODELS))
def test_fused_first_step_gradients_on_cuda_equal_separate_training(model, backend):
    factory, fit = MODELS[model]
    trials = []
    for seed, lr in enumerate((0.01, 0.05, 0.1)):
        torch.manual_seed(seed)
        trials.append(factory(lr))
    errors = fused_and_separate_first_gradients(trials, fit, backend=backend, accelerator="gpu")
    print(f"{model} on {backend}, CUDA float32 (TF32 off): relative first-step gradient errors {errors}")
    assert max(errors) <= 1e-5, errors


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_recurrent_trials_on_cuda_train_as_alone_when_one_is_stopped(cell):
    # on CUDA an nn.LSTM/GRU re-packs its weights for cuDNN (flatten_parameters, torch._cudnn_rnn_flatten_weight)
    # when moved and whenever functional_call hands it other tensors, which the CPU never does: the loop backend's
    # rows of the stacked weights, and the trial modules bound to them, must come through it unchanged
    from tests.fused.test_recurrent import fit as fit_recurrent
    from tests.fused.test_recurrent import trials as recurrent_trials
    from tests.helpers import StopTrialAt, max_state_difference, train_fused, train_separately

    modules = recurrent_trials(cell)
    alone = train_separately(modules, fit_recurrent, max_steps=12, accelerator="gpu")
    fused = train_fused(
        modules,
        fit_recurrent,
        fused_kwargs=dict(backend="loop"),
        callbacks=[StopTrialAt(5)],
        max_steps=12,
        accelerator="gpu",
    )
    errors = [max_state_difference(fused.unfuse(trial_id).cpu(), alone[trial_id].cpu()) for trial_id in (0, 2)]
    print(f"{cell} on loop, CUDA float32 (TF32 off), trial 1 stopped at step 5: relative state errors {errors}")
    assert max(errors) <= 1e-5, errors


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_the_trials_own_optimizer_step_on_cuda_runs_as_alone(backend):
    # each override runs as a greenlet in the fit's thread (its CUDA device and grad mode; before, a worker thread
    # had to be given the device): the docs' warm-up after the step, and one stepping inside torch.no_grad()
    from tests.fused.step.test_trial_optimizer_step import StepsWithoutGrad, WarmupAfterStep, _trials
    from tests.helpers import max_state_difference, train_fused, train_separately

    fit_kwargs = dict(max_epochs=2, limit_train_batches=5, limit_val_batches=1, accelerator="gpu")
    for cls in (WarmupAfterStep, StepsWithoutGrad):
        trials = _trials(cls)
        alone = train_separately(trials, fit_digits, **fit_kwargs)
        fused = train_fused(trials, fit_digits, fused_kwargs={"backend": backend}, **fit_kwargs)
        for row, own in enumerate(alone):
            assert fused.trial_module(row).rates == own.rates
            assert fused.trial_module(row).norms == pytest.approx(own.norms, rel=1e-5)
            assert max_state_difference(fused.unfuse(row).cpu(), own.cpu()) <= 1e-5, (cls.__name__, row)
