"""Train the digits MLP from ``conf/train.yaml``; with ``-m``, tune it as fused trial groups.

    python examples/train.py                  # one ordinary training run
    python examples/train.py -m               # the sweep: 32 random trials, groups of at most 16
    python examples/train.py -m hydra/launcher=joblib hydra.sweeper.n_trials=64 \
        'model.lr=tag(log, interval(1e-4, 1))'
    python examples/train.py -m --config-name train_resnet   # ResNet-18 on the 32x32 digits (conf/train_resnet.yaml)

The sweep writes ``results.json``, ``results.csv`` and ``plots/`` into its sweep directory
(``multirun/<date>/<time>/`` unless ``hydra.sweep.dir`` says otherwise); rerunning with the same
``hydra.sweep.dir`` resumes it. See ``docs/sweeper.md``.
"""

import hydra
from omegaconf import DictConfig

from lightning_hydro.stopping import TrialResult
from lightning_hydro.sweeper import fit_from_config


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> dict[int, TrialResult]:
    """Train every trial this job owns (one in a plain run) and return their results."""
    return fit_from_config(cfg)


if __name__ == "__main__":
    main()
