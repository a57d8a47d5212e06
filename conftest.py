"""Settings for every test run (tests/ and the doctests in lightning_hydro/)."""

import torch

# The test models are tiny: one thread is as fast as two, and it avoids OpenMP threads spinning against
# each other (and against other processes) on a small machine, which slows such models down 10-100x.
torch.set_num_threads(1)
