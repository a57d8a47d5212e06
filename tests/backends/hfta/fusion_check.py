"""Shared check: B fused trials give the same outputs, gradients and buffers as B unfused copies."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro.backends.hfta import convert_to_fused

TOLERANCE = 1e-5
IN_DIMS = st.sampled_from([None, 0, 1])
"""Where an input's trial dim sits: None = shared data batch, 0 or 1 = one input per trial."""


ABSOLUTE_FLOOR = 1e-4
"""Norm below which a tensor counts as zero: e.g. LayerNorm over one element has a weight gradient
that is exactly 0 in exact arithmetic and ~1e-8 in fp32, where a relative error means nothing."""


def relative_error(actual: Tensor, expected: Tensor) -> float:
    scale = max(expected.double().norm().item(), ABSOLUTE_FLOOR)
    return (actual.double() - expected.double()).norm().item() / scale


def assert_close(actual: Tensor, expected: Tensor, what: str, tolerance: float = TOLERANCE) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    error = relative_error(actual, expected)
    assert error <= tolerance, f"{what}: relative error {error:.2e} > {tolerance:.0e}"


def _tensors(output: Any) -> list[Tensor]:
    if isinstance(output, Tensor):
        return [output]
    return [item for item in output if isinstance(item, Tensor)]


def _place(stacked: Tensor, in_dim: int | None) -> Tensor:
    """The fused-run version of an input: shared as is, or per trial with its trial dim at ``in_dim``."""
    return stacked if in_dim is None else stacked.movedim(0, in_dim)


def _leaf(tensor: Tensor) -> Tensor:
    copy_ = tensor.detach().clone()
    return copy_.requires_grad_() if copy_.is_floating_point() else copy_


class WithAnchor(nn.Module):
    """A trial module plus one unused parameter, as any real model has: it lets parameter-free
    operators on the shared data batch see the trial dim (see TrialAnchor)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(()))
        self.inner = inner

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner(*args, **kwargs)


def check_fused_matches_trials(
    make_trial: Callable[[int], nn.Module],
    num_trials: int,
    inputs: Sequence[Tensor],
    in_dims: Sequence[int | None],
    *,
    kwargs: dict[str, Any] | None = None,
    train: bool = True,
    tolerance: float = TOLERANCE,
) -> nn.Module:
    """Runs the trials fused (vmap over the converted template) and one by one, and compares outputs,
    parameter gradients, input gradients and buffers. Per-trial inputs are given stacked ``[B, ...]``.
    Returns the converted trial module, for further checks."""
    kwargs = kwargs or {}
    trials = [WithAnchor(make_trial(slot)) for slot in range(num_trials)]
    for trial in trials:
        trial.train(train)
    references = copy.deepcopy(trials)
    model = convert_to_fused(copy.deepcopy(trials[0]), trials)
    params, buffers = stack_module_state(trials)
    fused_inputs = [_leaf(_place(x, in_dim)) for x, in_dim in zip(inputs, in_dims)]

    def per_trial(p: dict[str, Tensor], b: dict[str, Tensor], *xs: Tensor) -> Any:
        return tuple(_tensors(functional_call(model, (p, b), tuple(xs), kwargs)))  # drops None outputs

    fused_out = _tensors(
        vmap(per_trial, in_dims=(0, 0, *in_dims), randomness="different")(params, buffers, *fused_inputs)
    )
    # Random cotangents weigh every output element; integer outputs (pooling indices) have none.
    cotangents = [torch.randn_like(out) if out.is_floating_point() else torch.zeros_like(out) for out in fused_out]
    if any(out.requires_grad for out in fused_out):
        sum((out * cot).sum() for out, cot in zip(fused_out, cotangents) if out.requires_grad).backward()
    shared_grads: list[Tensor | None] = [None] * len(inputs)
    for slot, reference in enumerate(references):
        slot_inputs = [_leaf(x if in_dim is None else x[slot]) for x, in_dim in zip(inputs, in_dims)]
        expected = _tensors(reference(*slot_inputs, **kwargs))
        assert len(expected) == len(fused_out), "fused and unfused return different numbers of tensors"
        for index, (out, exp) in enumerate(zip(fused_out, expected)):
            assert_close(out[slot], exp, f"trial {slot} output {index}", tolerance)
        if any(exp.requires_grad for exp in expected):
            sum((exp * cot[slot]).sum() for exp, cot in zip(expected, cotangents) if exp.requires_grad).backward()
        for name, parameter in reference.named_parameters():
            stacked_grad = params[name].grad
            expected_grad = torch.zeros_like(parameter) if parameter.grad is None else parameter.grad
            actual_grad = torch.zeros_like(parameter) if stacked_grad is None else stacked_grad[slot]
            assert_close(actual_grad, expected_grad, f"trial {slot} grad of {name}", tolerance)
        for name, buffer in reference.named_buffers():
            assert_close(buffers[name][slot].to(buffer.dtype), buffer, f"trial {slot} buffer {name}", tolerance)
        for index, (x, in_dim) in enumerate(zip(slot_inputs, in_dims)):
            if x.grad is None:
                continue
            fused_grad = fused_inputs[index].grad
            assert fused_grad is not None, f"input {index} got no gradient from the fused run"
            if in_dim is None:
                shared_grads[index] = x.grad if shared_grads[index] is None else shared_grads[index] + x.grad
            else:
                assert_close(fused_grad.movedim(in_dim, 0)[slot], x.grad, f"trial {slot} grad of input {index}")
    for index, total in enumerate(shared_grads):
        if total is not None:
            fused_grad = fused_inputs[index].grad
            assert fused_grad is not None
            assert_close(fused_grad, total, f"grad of shared input {index}", tolerance)
    return model.inner


def stacked_or_shared(draw: st.DrawFn, shape: Sequence[int], num_trials: int) -> tuple[Tensor, int | None]:
    """Draws where the input's trial dim is; returns the input (``shape`` if shared, else ``[B, *shape]``)."""
    in_dim = draw(IN_DIMS)
    if in_dim is None:
        return torch.randn(*shape), None
    return torch.randn(num_trials, *shape), in_dim
