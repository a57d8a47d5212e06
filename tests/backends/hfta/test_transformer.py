import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro.backends.hfta import convert_to_fused
from lightning_hydro.backends.hfta.transformer import FusedTransformerEncoder, FusedTransformerEncoderLayer

from .fusion_check import assert_close


def test_transformer_blocks_run_their_python_path_in_eval_mode() -> None:
    def make() -> nn.Module:
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        return nn.TransformerEncoder(layer, 2)

    trials = [make().eval() for _ in range(2)]
    model = convert_to_fused(trials[0], trials).eval()
    assert isinstance(model, FusedTransformerEncoder)
    assert isinstance(model.layers[0], FusedTransformerEncoderLayer)
    params, buffers = stack_module_state(trials)
    x = torch.randn(3, 5, 8)
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[1, 3:] = True
    with torch.no_grad():  # torch's fast path would use nested tensors, which vmap cannot batch
        out = vmap(lambda p, b: functional_call(model, (p, b), (x,), {"src_key_padding_mask": padding}))(
            params, buffers
        )
        for slot, trial in enumerate(trials):
            expected = trial(x, src_key_padding_mask=padding)
            assert_close(out[slot][~padding], expected[~padding], f"trial {slot}")
