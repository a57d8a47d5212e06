"""muP surrogates: tune a width / S copy of a model, then train the full-size one as tuned.

Example::

    >>> from lightning_hydro.scaling import Surrogate
    >>> from lightning_hydro.demos.digits import DigitsMLP
    >>> s = Surrogate(DigitsMLP, width=["hidden_dim"], ratio=4)
    >>> trials = [s.build(hidden_dim=256, lr=lr) for lr in (0.03, 0.1, 0.3)]   # hidden_dim 64, under muP
    >>> target = s.build(hidden_dim=256, lr=0.1, ratio=1)                      # full size, same lr
"""

from lightning_hydro.scaling.coord_check import CoordCheck, coord_check, plot_coord_checks
from lightning_hydro.scaling.multipliers import Multipliers
from lightning_hydro.scaling.rank_fidelity import rank_fidelity
from lightning_hydro.scaling.readout import ReadoutScale
from lightning_hydro.scaling.surrogate import Surrogate
from lightning_hydro.scaling.width_scaling import WidthScaling, configure_scaled_optimizers

__all__ = [
    "CoordCheck",
    "Multipliers",
    "ReadoutScale",
    "Surrogate",
    "WidthScaling",
    "configure_scaled_optimizers",
    "coord_check",
    "plot_coord_checks",
    "rank_fidelity",
]
