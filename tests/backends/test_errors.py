import torch
from torch.func import vmap

from lightning_hydro.backends.errors import explain_vmap_error, user_frame


def test_other_errors_are_left_alone():
    assert explain_vmap_error(ValueError("shapes do not match"), method="training_step", module_name="M") is None


def test_vmap_errors_get_advice():
    err = RuntimeError("vmap: It looks like you're calling .item() on a Tensor. We don't support vmap over ...")
    explained = explain_vmap_error(err, method="training_step", module_name="Net")
    assert explained is not None
    assert str(explained).startswith("backend='vmap' cannot fuse Net.training_step: it calls .item()")
    assert "Use backend='loop'" in str(explained)


def data_dependent_step(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:  # vmap cannot batch a Python branch on tensor values
        return x
    return -x


def test_user_frame_names_the_users_line():
    try:
        vmap(data_dependent_step)(torch.ones(2, 3))
    except RuntimeError as error:
        located = user_frame(error)
    else:
        raise AssertionError("vmap accepted a data-dependent branch")
    assert located.endswith(
        "in data_dependent_step: if x.sum() > 0:  # vmap cannot batch a Python branch on tensor values"
    )
    assert "test_errors.py:" in located


def test_user_frame_without_user_frames():
    assert user_frame(RuntimeError("never raised")) == "unknown location"
