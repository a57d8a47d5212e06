import logging
import warnings

import pytest
import torch
from hypothesis import register_random, settings

from lightning_hydro.backends.auto import clear_backend_cache


class _TorchGlobalRandom:
    """torch's global RNG, in the Random-like form Hypothesis seeds and restores around every example.

    The property tests draw shapes from Hypothesis and tensor values from torch: without this, a replayed
    example gets other values than the failing one (Hypothesis reports a "flaky" failure that cannot be
    reproduced or shrunk).
    """

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def getstate(self) -> torch.Tensor:
        return torch.get_rng_state()

    def setstate(self, state: torch.Tensor) -> None:
        torch.set_rng_state(state)


_TORCH_RANDOM = _TorchGlobalRandom()  # Hypothesis keeps only a weak reference
register_random(_TORCH_RANDOM)
# the same examples on every run (CI included): a failure is a failure of the code, not of the draw
settings.register_profile("lightning_hydro", derandomize=True)
settings.load_profile("lightning_hydro")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``gpu``-marked tests run only where CUDA is available."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
