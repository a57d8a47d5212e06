import logging
import warnings

import pytest
import torch

from lightning_hydro.backends.auto import clear_backend_cache


@pytest.fixture(autouse=True)
def _quiet_and_seeded():
    """Every test starts from the same RNG state, with Lightning's chatter silenced."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    torch.manual_seed(0)
    clear_backend_cache()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*LeafSpec.*")
        yield
