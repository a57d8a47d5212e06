"""Rebuild a trial module from its class and hyperparameters (for trials added during a checkpointed run).

Example::

    >>> from lightning_hydro.demos import DigitsMLP
    >>> spec = module_spec(DigitsMLP(hidden_dim=8, lr=0.3))
    >>> spec["class"], spec["hparams"]["lr"]
    ('lightning_hydro.demos.digits:DigitsMLP', 0.3)
    >>> build_from_spec(spec, trial_id=5).hparams.hidden_dim
    8
"""

from __future__ import annotations

import importlib
from typing import Any

import lightning as L

__all__ = ["build_from_spec", "module_spec"]


def module_spec(module: L.LightningModule) -> dict[str, Any]:
    """The import path of the module's class and its saved hyperparameters."""
    cls = type(module)
    return {"class": f"{cls.__module__}:{cls.__qualname__}", "hparams": dict(module.hparams)}


def build_from_spec(spec: dict[str, Any], *, trial_id: int) -> L.LightningModule:
    """Instantiate ``class(**hparams)`` from a :func:`module_spec`.

    Raises:
        RuntimeError: the class cannot be imported, or it saved no hyperparameters to rebuild it from.
    """
    module_name, _, qualname = spec["class"].partition(":")
    advice = (
        f"Trial {trial_id} joined the group during the checkpointed run, so it is rebuilt from its class and "
        "saved hyperparameters"
    )
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as err:
        raise RuntimeError(f"{advice}, but {spec['class']} cannot be imported: {err}.") from err
    if not spec["hparams"] and "<locals>" not in qualname:
        try:
            return target()
        except TypeError as err:
            raise RuntimeError(
                f"{advice}, but {qualname} saved none: call self.save_hyperparameters() in its __init__, or "
                f"pass the trial module to FusedLightningModule(trials=[...], trial_ids=[...]) yourself."
            ) from err
    return target(**spec["hparams"])
