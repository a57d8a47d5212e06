import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro.backends.hfta import convert_to_fused
from lightning_hydro.backends.hfta.embedding import FusedEmbedding

from .fusion_check import IN_DIMS, check_fused_matches_trials


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_fused_embedding_matches_separate_trials(data: st.DataObject) -> None:
    trials = data.draw(st.integers(1, 4), label="trials")
    rows, width = data.draw(st.integers(2, 6), label="rows"), data.draw(st.integers(1, 4), label="width")
    padding = data.draw(st.lists(st.one_of(st.none(), st.integers(0, rows - 1)), min_size=trials, max_size=trials))
    max_norm = data.draw(st.lists(st.sampled_from([None, 0.5, 1.5]), min_size=trials, max_size=trials))
    norm_type = data.draw(st.sampled_from([1.0, 2.0]), label="norm type")
    scale_grad_by_freq = data.draw(st.booleans(), label="scale grad by freq")
    shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=2), label="index shape")
    in_dim = data.draw(IN_DIMS, label="in dim")
    if in_dim == 1 and len(shape) == 1:
        in_dim = 0
    indices = torch.randint(0, rows, shape if in_dim is None else [trials, *shape])

    def make(slot: int) -> nn.Module:
        return nn.Embedding(
            rows,
            width,
            padding_idx=padding[slot],
            max_norm=max_norm[slot],
            norm_type=norm_type,
            scale_grad_by_freq=scale_grad_by_freq,
        )

    assert isinstance(check_fused_matches_trials(make, trials, [indices], [in_dim]), FusedEmbedding)


def test_padding_row_is_frozen_in_its_own_trial_only() -> None:
    """The earlier-library bug: padding_idx=k must not freeze trial k's table, only row k of each trial."""
    trials = [nn.Embedding(4, 2, padding_idx=1) for _ in range(3)]
    model = convert_to_fused(trials[0], trials)
    params, _ = stack_module_state(trials)
    tokens = torch.tensor([0, 1, 2, 3, 1])
    vmap(lambda p: functional_call(model, p, (tokens,)))(params).sum().backward()
    grad = params["weight"].grad
    assert grad is not None
    assert torch.equal(grad[:, 1], torch.zeros(3, 2))
    assert torch.equal(grad[:, [0, 2, 3]], torch.ones(3, 3, 2))
