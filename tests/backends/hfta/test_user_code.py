"""The user's own code between modules is not rewritten: it runs under vmap on each trial's logical
tensors, so dimension-sensitive calls stay correct even on the layouts fused operators return."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .fusion_check import check_fused_matches_trials


class DimensionSensitive(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=False)  # a bias before BN has gradient 0 + noise
        self.norm = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.embed = nn.Embedding(7, 4)
        self.fc = nn.Linear(4 + 16 + 16 + 16 + 5 + 4 * 16 + 4 * 16 + 4 + 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu(self.norm(self.conv1(x)))  # [N, 4, 4, 4], trial dim 1 underneath
        b = self.conv2(a)
        both = torch.cat([a, b], dim=1)
        stacked = torch.stack([a, b], dim=1).sum(1)
        features = [
            both.mean(dim=(2, 3))[:, 4:],
            self.pool(stacked).view(stacked.size(0), -1),
            self.pool(b).view(-1, 4 * 2 * 2),
            torch.flatten(self.pool(a), 1),
            b.reshape(b.shape[0], -1)[:, :5],
            torch.split(both, 4, dim=1)[1].flatten(1),
            a.permute(0, 2, 3, 1).contiguous().view(a.size(0), -1),
            self.embed(torch.arange(a.shape[0]) % 7),
            a.sum(0).mean(dim=(1, 2)).expand(a.shape[0], 4),  # a reduction over the data batch
        ]
        return self.fc(torch.cat(features, dim=1))


@pytest.mark.parametrize("in_dim", [None, 0, 1])
def test_dimension_sensitive_user_code_stays_exact(in_dim: int | None) -> None:
    x = torch.randn(3, 2, 3, 4, 4) if in_dim is not None else torch.randn(2, 3, 4, 4)
    check_fused_matches_trials(lambda _: DimensionSensitive(), 3, [x], [in_dim])
