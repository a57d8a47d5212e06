import torch
from torch.func import vmap

from lightning_hydro.backends.hfta import failing_user_call


def data_dependent_step(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:  # vmap cannot batch a Python branch on tensor values
        return x
    return -x


def test_failing_user_call_names_the_users_line() -> None:
    try:
        vmap(data_dependent_step)(torch.ones(2, 3))
    except RuntimeError as error:
        located = failing_user_call(error)
    else:
        raise AssertionError("vmap accepted a data-dependent branch")
    assert located is not None
    assert located.endswith(
        "in data_dependent_step: if x.sum() > 0:  # vmap cannot batch a Python branch on tensor values"
    )
    assert "test_errors.py:" in located


def test_failing_user_call_is_none_without_user_frames() -> None:
    assert failing_user_call(RuntimeError("never raised")) is None
