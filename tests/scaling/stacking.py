"""A minimal stand-in for the fused core, as DESIGN.md section 3 specifies it, to test muP trials fused.

Trials are stacked with ``torch.func.stack_module_state``; each trial parameter's ``.data`` is bound to its
slice of the stacked tensor; the forward runs ``vmap(functional_call(...))`` over the stacked state; the
loss is the sum of the trial losses; after backward each trial parameter's ``.grad`` is its slice of the
stacked gradient; and each trial's own ``configure_optimizers()`` optimizer steps it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro.scaling.param_groups import find_optimizers


def vmapped_forward(models: Sequence[nn.Module], inputs: torch.Tensor) -> torch.Tensor:
    """Outputs ``[B, ...]`` of the stacked ``models`` on shared ``inputs``, through one vmapped call."""
    params, buffers = stack_module_state(list(models))
    template = copy.deepcopy(models[0]).to("meta")
    return vmap(lambda p, b: functional_call(template, (p, b), (inputs,)))(params, buffers)


class StackedTrials:
    """Trains ``models`` fused: one vmapped forward/backward per step, each trial its own optimizer."""

    def __init__(self, models: Sequence[nn.Module], loss: Callable[[torch.Tensor, Any], torch.Tensor]) -> None:
        self.models = list(models)
        self.loss = loss
        self.params, self.buffers = stack_module_state(self.models)
        self.template = copy.deepcopy(self.models[0]).to("meta")
        for index, model in enumerate(self.models):
            for name, param in model.named_parameters():
                param.data = self.params[name].data[index]  # bound: the trial sees the stacked weights
        self.optimizers = [find_optimizers(m.configure_optimizers())[0][0] for m in self.models]

    def __call__(self, batch: Any) -> None:
        inputs = batch[0]
        outputs = vmap(lambda p, b: functional_call(self.template, (p, b), (inputs,)))(self.params, self.buffers)
        total = sum(self.loss(outputs[i], batch) for i in range(len(self.models)))
        for param in self.params.values():
            param.grad = None
        total.backward()  # type: ignore[union-attr]
        for index, (model, optimizer) in enumerate(zip(self.models, self.optimizers)):
            for name, param in model.named_parameters():
                param.grad = self.params[name].grad[index]
            optimizer.step()
