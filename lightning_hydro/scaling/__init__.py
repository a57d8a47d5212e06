"""muP surrogates: tune a width / S copy of a model, then train the full-size one as tuned.

Example::

    >>> from lightning_hydro.scaling import Surrogate
    >>> from lightning_hydro.demos.digits import DigitsMLP
    >>> s = Surrogate(DigitsMLP, width=["hidden_dim"], ratio=4)
    >>> trials = [s.build(hidden_dim=256, lr=lr) for lr in (0.03, 0.1, 0.3)]   # hidden_dim 64, under muP
    >>> target = s.build(hidden_dim=256, lr=0.1, ratio=1)                      # full size, same lr
"""

from lightning_hydro.scaling.coord_check import (
    ActivationSize,
    CoordCheck,
    activation_sizes,
    coord_check,
    per_model_update,
    plot_coord_checks,
)
from lightning_hydro.scaling.multipliers import DEFAULT_RULES, Multipliers, OptimizerRule
from lightning_hydro.scaling.rank_fidelity import Interval, rank_fidelity, rank_fidelity_difference
from lightning_hydro.scaling.readout import ReadoutScale
from lightning_hydro.scaling.surrogate import Surrogate
from lightning_hydro.scaling.width_scaling import (
    WidthScaling,
    configure_scaled_optimizers,
    fold_multipliers,
    width_scaling_of,
)

__all__ = [
    "DEFAULT_RULES",
    "ActivationSize",
    "CoordCheck",
    "Interval",
    "Multipliers",
    "OptimizerRule",
    "ReadoutScale",
    "Surrogate",
    "WidthScaling",
    "activation_sizes",
    "configure_scaled_optimizers",
    "coord_check",
    "fold_multipliers",
    "per_model_update",
    "plot_coord_checks",
    "rank_fidelity",
    "rank_fidelity_difference",
    "width_scaling_of",
]
