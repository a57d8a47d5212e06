"""The package's public names: what users need, old names deprecated."""

import importlib

import pytest
import torch

import lightning_hydro.optim as optim
from lightning_hydro.fused.step import fused_update, select_update
from lightning_hydro.fused.step.fused_update import FusedAdamUpdate, FusedSGDUpdate


@pytest.mark.parametrize(("old", "new"), [("FusedAdam", FusedAdamUpdate), ("FusedSGD", FusedSGDUpdate)])
def test_the_fused_updates_do_not_pose_as_optimizers(old, new):
    assert not issubclass(new, torch.optim.Optimizer)
    assert old not in optim.__all__
    with pytest.warns(DeprecationWarning, match=rf"lightning_hydro.optim.{old} is renamed .*{new.__name__}: .*not a"):
        assert getattr(optim, old) is new
    missing = "FusedRMSprop"
    with pytest.raises(AttributeError, match=r"has no attribute 'FusedRMSprop'"):
        getattr(optim, missing)


@pytest.mark.parametrize("name", ["FusedAdamUpdate", "FusedSGDUpdate", "FusedUpdate", "select_fused_update"])
def test_the_old_module_of_the_fused_updates_still_resolves_them(name):
    old = importlib.import_module("lightning_hydro.optim.fused_update")
    new = select_update if name == "select_fused_update" else fused_update
    with pytest.warns(DeprecationWarning, match=rf"optim.fused_update.{name} moved to {new.__name__}.{name}"):
        assert getattr(old, name) is getattr(new, name)
