"""The package's public names: what users need, old names deprecated."""

import pytest
import torch

import lightning_hydro.optim as optim
from lightning_hydro.optim.fused_update import FusedAdamUpdate, FusedSGDUpdate


@pytest.mark.parametrize(("old", "new"), [("FusedAdam", FusedAdamUpdate), ("FusedSGD", FusedSGDUpdate)])
def test_the_fused_updates_do_not_pose_as_optimizers(old, new):
    assert not issubclass(new, torch.optim.Optimizer)
    assert old not in optim.__all__
    with pytest.warns(DeprecationWarning, match=rf"lightning_hydro.optim.{old} is renamed .*{new.__name__}: .*not a"):
        assert getattr(optim, old) is new
    missing = "FusedRMSprop"
    with pytest.raises(AttributeError, match=r"has no attribute 'FusedRMSprop'"):
        getattr(optim, missing)
