"""The trial rules live in torch.nn.functional only while a fused vmap step runs (issue 20, item 1)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

from lightning_hydro.backends.trial_ops.functional_patch import RULES, trial_functional


def originals() -> dict[str, object]:
    return {name: getattr(F, name) for name in RULES}


def test_the_rules_are_installed_inside_and_the_originals_restored_after():
    before = originals()
    with trial_functional():
        inside = originals()
        assert all(inside[name] is not before[name] for name in RULES)
        assert all(inside[name].__lightning_hydro_original__ is before[name] for name in RULES)
    assert originals() == before


def test_the_originals_come_back_when_the_step_raises():
    before = originals()
    with pytest.raises(ZeroDivisionError), trial_functional():
        1 / 0  # noqa: B018
    assert originals() == before


def test_nested_steps_restore_the_originals_once_the_outermost_exits():
    before = originals()
    with trial_functional():
        installed = originals()
        with trial_functional():
            assert originals() == installed
        assert originals() == installed  # the inner exit leaves the outer step's rules in place
    assert originals() == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_calls_on_tensors_that_vmap_does_not_map_are_the_original_calls(dtype):
    x, w, b = torch.randn(4, 6, dtype=dtype), torch.randn(6, dtype=dtype), torch.randn(6, dtype=dtype)
    expected = F.layer_norm(x, (6,), w, b), F.linear(x, w.expand(3, 6), b[:3])
    with trial_functional():
        got = F.layer_norm(x, (6,), w, b), F.linear(x, w.expand(3, 6), b[:3])
    for g, e in zip(got, expected):
        assert torch.equal(g, e)


def test_a_mapped_call_still_reaches_torch_where_no_rule_applies():
    # a weight shared by all trials: vmap's own batching calls linear on the stacked input
    x, w = torch.randn(3, 4, 6), torch.randn(5, 6)
    with trial_functional():
        out = vmap(lambda row: F.linear(row, w))(x)
    torch.testing.assert_close(out, x @ w.T)


def test_in_float32_only_attention_runs_by_its_rule(monkeypatch):
    from lightning_hydro.backends.trial_ops import projection

    calls = []
    monkeypatch.setattr(projection, "FoldedLinear", type("Spy", (), {"apply": lambda *a: calls.append(a) or 1 / 0}))
    x, w = torch.randn(4, 6), torch.randn(3, 5, 6)
    with trial_functional():
        vmap(lambda w: F.linear(x, w))(w)  # float32: vmap's own batching (rounding apart, no rule overhead)
        assert calls == []
        with pytest.raises(ZeroDivisionError):  # half precision: the rule (one kernel call, bias inside)
            vmap(lambda w: F.linear(x.bfloat16(), w))(w.bfloat16())
    assert len(calls) == 1


def test_a_float32_step_installs_only_the_rules_float32_needs():
    before = originals()
    with trial_functional(reduced_precision=False):
        changed = {name for name in RULES if getattr(F, name) is not before[name]}
        assert changed == {"scaled_dot_product_attention"}
        with trial_functional():  # a nested step in half precision gets the others, until the outer one ends
            assert all(getattr(F, name) is not before[name] for name in RULES)
    assert originals() == before
