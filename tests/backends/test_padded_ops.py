"""The facts width padding rests on, per supported op (issue 14 item 1).

A padded hidden unit has zero weights in and zero weights out. These tests show, op by op, where that alone
keeps it inert and where it does not, and so why a padded group steps each trial's own optimizer on its own
(true-width) parameters: the padding is then never written, whatever the arithmetic would do with it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_hydro.backends.padded_vmap import masked_layer_norm
from lightning_hydro.stacking.padding import pad_to, zero_padding_

ZERO_AT_ZERO = {"relu": torch.relu, "gelu": F.gelu, "tanh": torch.tanh}
NONZERO_AT_ZERO = {"sigmoid": torch.sigmoid, "softplus": F.softplus}


def padded_mlp_grads(activation) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A width-4 MLP padded to 6: the hidden activations and the gradients of both weights."""
    torch.manual_seed(0)
    w1 = pad_to(torch.randn(4, 5), (6, 5)).requires_grad_()
    b1 = pad_to(torch.randn(4), (6,)).requires_grad_()
    w2 = pad_to(torch.randn(3, 4), (3, 6)).requires_grad_()
    x = torch.randn(8, 5)
    h = activation(x @ w1.T + b1)
    (h @ w2.T).square().sum().backward()
    return h.detach(), w1.grad, w2.grad


@pytest.mark.parametrize("name", sorted(ZERO_AT_ZERO))
def test_a_padded_unit_has_zero_activation_and_zero_gradient_when_the_activation_maps_0_to_0(name: str) -> None:
    h, g1, g2 = padded_mlp_grads(ZERO_AT_ZERO[name])
    assert h[:, 4:].count_nonzero() == 0
    assert g1[4:].count_nonzero() == 0
    assert g2[:, 4:].count_nonzero() == 0


@pytest.mark.parametrize("name", sorted(NONZERO_AT_ZERO))
def test_an_activation_with_f0_nonzero_makes_the_padded_outgoing_gradient_nonzero(name: str) -> None:
    h, g1, g2 = padded_mlp_grads(NONZERO_AT_ZERO[name])
    assert h[:, 4:].count_nonzero() > 0
    assert g1[4:].count_nonzero() == 0  # nothing flows back through zero outgoing weights...
    assert g2[:, 4:].count_nonzero() > 0  # ...but the outgoing weights' own gradient is not zero
    zero_padding_(g2.unsqueeze(0), [(3, 4)])  # the general guard, for updates over whole stacked tensors
    assert g2[:, 4:].count_nonzero() == 0


def test_batch_norm_over_a_padded_channel_gives_zero_and_zero_gradients() -> None:
    torch.manual_seed(0)
    x = torch.cat([torch.randn(16, 3), torch.zeros(16, 2)], dim=1).requires_grad_()
    weight = pad_to(torch.rand(3) + 0.5, (5,)).requires_grad_()
    bias = pad_to(torch.randn(3), (5,)).requires_grad_()
    mean, var = torch.zeros(5), torch.ones(5)
    y = F.batch_norm(x, mean, var, weight, bias, training=True, momentum=0.1)
    upstream = torch.cat([torch.randn(16, 3), torch.zeros(16, 2)], dim=1)  # through the next layer's zero weights
    (y * upstream).sum().backward()
    assert y[:, 3:].count_nonzero() == 0
    assert weight.grad[3:].count_nonzero() == 0
    assert bias.grad[3:].count_nonzero() == 0
    assert mean[3:].count_nonzero() == 0  # the padded running mean stays 0; the variance decays, sliced at unfuse
    eval_y = F.batch_norm(x, mean, torch.zeros(5), weight, bias, training=False)
    assert eval_y[:, 3:].count_nonzero() == 0


def test_a_padded_output_channel_of_a_convolution_is_zero() -> None:
    torch.manual_seed(0)
    weight = pad_to(torch.randn(3, 2, 3, 3), (5, 2, 3, 3))
    bias = pad_to(torch.randn(3), (5,))
    y = F.conv2d(torch.randn(2, 2, 6, 6), weight, bias, padding=1)
    assert y[:, 3:].count_nonzero() == 0


def test_masked_layer_norm_equals_layer_norm_at_the_trial_s_width_values_and_gradients() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 7, dtype=torch.float64)
    w, b = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    x_own, w_own, b_own = (t[..., :5].clone().requires_grad_() for t in (x, w, b))
    x_pad = torch.cat([x_own.detach(), torch.randn(4, 2, dtype=torch.float64)], dim=1).requires_grad_()  # garbage
    w_pad, b_pad = (pad_to(t.detach(), (7,)).requires_grad_() for t in (w_own, b_own))
    mask = torch.tensor([1.0] * 5 + [0.0] * 2, dtype=torch.float64)
    upstream = torch.randn(4, 7, dtype=torch.float64)
    own = F.layer_norm(x_own, (5,), w_own, b_own, 1e-5)
    padded = masked_layer_norm(x_pad, mask, w_pad, b_pad, 1e-5)
    (own * upstream[:, :5]).sum().backward()
    (padded * upstream).sum().backward()
    assert torch.allclose(padded[:, :5], own, atol=1e-12)
    assert padded[:, 5:].count_nonzero() == 0
    assert torch.allclose(x_pad.grad[:, :5], x_own.grad, atol=1e-12)
    assert x_pad.grad[:, 5:].count_nonzero() == 0
    assert torch.allclose(w_pad.grad[:5], w_own.grad, atol=1e-12)
    assert w_pad.grad[5:].count_nonzero() == 0


OPTIMIZERS = {
    "sgd_momentum_decay": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
    "adam_eps": lambda p: torch.optim.Adam(p, lr=0.1, eps=1e-3, weight_decay=0.1),
    "adamw_decoupled_amsgrad": lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.5, amsgrad=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizers_keep_zero_padding_zero_given_zero_gradients_and_zero_state(name: str) -> None:
    """What an update over a whole stacked tensor does to its padding: nothing, while its gradient is zero."""
    torch.manual_seed(0)
    param = torch.nn.Parameter(pad_to(torch.randn(3, 4), (5, 6)))
    optimizer = OPTIMIZERS[name]([param])
    for _ in range(5):
        param.grad = pad_to(torch.randn(3, 4), (5, 6))
        optimizer.step()
    assert param[3:].count_nonzero() == 0
    assert param[:, 4:].count_nonzero() == 0
    assert param[:3, :4].count_nonzero() == 12


def test_an_optimizer_on_a_trial_s_own_view_never_writes_the_padding() -> None:
    """The padded group's way: the trial's optimizer holds a view of its true region only."""
    stacked = pad_to(torch.randn(3, 4), (5, 6))
    view = nn.Parameter(stacked[:3, :4])
    view.data = stacked[:3, :4]
    optimizer = torch.optim.AdamW([view], lr=0.1, weight_decay=0.5)
    for _ in range(3):
        view.grad = torch.randn(3, 4)
        optimizer.step()
    assert stacked[3:].count_nonzero() == 0
    assert stacked[:, 4:].count_nonzero() == 0
    assert torch.equal(stacked[:3, :4], view.detach())
