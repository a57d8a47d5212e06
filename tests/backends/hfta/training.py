"""A plain-torch SGD loop, run fused (vmap over the converted template) and trial by trial."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro.backends.hfta import convert_to_fused

Loss = Callable[[Tensor, Tensor], Tensor]
Batch = tuple[Tensor, Tensor]


def train_fused(
    trials: Sequence[nn.Module], learning_rates: Sequence[float], batches: Sequence[Batch], loss_fn: Loss
) -> dict[str, Tensor]:
    """SGD on the stacked state: one vmapped forward, the SUM of trial losses, one backward."""
    model = convert_to_fused(copy.deepcopy(trials[0]), trials)
    params, buffers = stack_module_state(trials)
    rates = torch.tensor(learning_rates, dtype=torch.float64)

    def trial_loss(p: dict[str, Tensor], b: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        return loss_fn(functional_call(model, (p, b), (x,)), y)

    for x, y in batches:
        losses = vmap(trial_loss, in_dims=(0, 0, None, None), randomness="different")(params, buffers, x, y)
        losses.sum().backward()
        with torch.no_grad():
            for parameter in params.values():
                assert parameter.grad is not None
                rate = rates.to(parameter.dtype).view(-1, *[1] * (parameter.dim() - 1))
                parameter -= rate * parameter.grad
                parameter.grad = None
    return {**params, **buffers}


def train_separately(
    trials: Sequence[nn.Module], learning_rates: Sequence[float], batches: Sequence[Batch], loss_fn: Loss
) -> dict[str, Tensor]:
    """The same SGD, each trial on its own with torch.optim.SGD; returns the states stacked."""
    for trial, rate in zip(trials, learning_rates):
        optimizer = torch.optim.SGD(trial.parameters(), lr=rate)
        for x, y in batches:
            optimizer.zero_grad()
            loss_fn(trial(x), y).backward()
            optimizer.step()
    states = [dict(trial.named_parameters()) | dict(trial.named_buffers()) for trial in trials]
    return {name: torch.stack([state[name].detach() for state in states]) for name in states[0]}
