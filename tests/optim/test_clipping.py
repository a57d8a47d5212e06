import torch
from torch import nn

from lightning_hydro.optim import clip_grad_norm_per_trial, clip_grad_value_per_trial


def test_each_row_is_clipped_as_its_trial_alone_would_be():
    g = torch.Generator().manual_seed(0)
    stacked = [nn.Parameter(torch.zeros(3, 4, 2)), nn.Parameter(torch.zeros(3, 5))]
    grads = [
        torch.randn(p.shape, generator=g) * torch.tensor([0.01, 1.0, 10.0]).view(-1, *[1] * (p.dim() - 1))
        for p in stacked
    ]
    for p, grad in zip(stacked, grads):
        p.grad = grad.clone()
    norms = clip_grad_norm_per_trial(stacked, max_norm=1.0)
    for row in range(3):
        alone = [nn.Parameter(torch.zeros(p.shape[1:])) for p in stacked]
        for p, grad in zip(alone, grads):
            p.grad = grad[row].clone()
        total = torch.nn.utils.clip_grad_norm_(alone, max_norm=1.0)
        assert torch.isclose(norms[row], total, rtol=1e-6)
        for p_stacked, p_alone in zip(stacked, alone):
            torch.testing.assert_close(p_stacked.grad[row], p_alone.grad, rtol=1e-6, atol=1e-8)
    assert torch.allclose(stacked[0].grad[0], grads[0][0])  # small gradients are left alone


def test_value_clipping_is_elementwise():
    p = nn.Parameter(torch.zeros(2, 3))
    p.grad = torch.tensor([[-2.0, 0.5, 3.0], [0.1, -0.2, 0.3]])
    clip_grad_value_per_trial([p], 1.0)
    assert torch.equal(p.grad, torch.tensor([[-1.0, 0.5, 1.0], [0.1, -0.2, 0.3]]))


def test_parameters_without_gradients_are_ignored():
    assert clip_grad_norm_per_trial([nn.Parameter(torch.zeros(2, 3))], 1.0).numel() == 0
