"""Build trial modules: from hyperparameter configs, or again from their class and hyperparameters.

:func:`trials_from_configs` builds a group's trials from configs (``FusedLightningModule.from_configs``);
:func:`module_spec` and :func:`build_from_spec` rebuild trials that joined during a checkpointed run.

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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightning as L

from lightning_hydro.fused.group.trial_layers import build_trial_layers

__all__ = ["build_from_spec", "module_spec", "rebuild_trials", "restore_width_scaling", "trials_from_configs"]

TrialFactory = Callable[[int], L.LightningModule | None]


def trials_from_configs(
    factory: Callable[..., L.LightningModule],
    configs: Sequence[Mapping[str, Any]],
    *,
    width: str | Sequence[str] | None = None,
    ratio: int = 1,
    trial_ids: Sequence[int] | None = None,
) -> tuple[list[L.LightningModule], list[int], TrialFactory]:
    """One module per config (``factory(**config)``, or its width / ``ratio`` muP surrogate with ``width``).

    Returns:
        The modules, their ids (default ``0..B-1``), and a factory that builds a trial id's module again.
    """
    from lightning_hydro.scaling import Surrogate

    plain = [dict(config) for config in configs]
    ids = list(range(len(plain))) if trial_ids is None else [int(t) for t in trial_ids]
    surrogate = None if width is None else Surrogate(factory, width=width, ratio=ratio)

    def build(config: dict[str, Any]) -> L.LightningModule:
        return factory(**config) if surrogate is None else surrogate.build(**config)  # type: ignore[return-value]

    by_id = dict(zip(ids, plain))
    return [build(config) for config in plain], ids, lambda tid: build(by_id[tid]) if tid in by_id else None


def module_spec(module: L.LightningModule) -> dict[str, Any]:
    """The import path of the module's class, its saved hyperparameters, and its muP width scaling, if any."""
    from lightning_hydro.scaling.width_scaling import width_scaling_of

    cls = type(module)
    spec: dict[str, Any] = {"class": f"{cls.__module__}:{cls.__qualname__}", "hparams": dict(module.hparams)}
    scaling = width_scaling_of(module)
    if scaling is not None:
        spec["width_scaling"] = scaling.to_dict()
    return spec


def restore_width_scaling(module: L.LightningModule, spec: dict[str, Any]) -> L.LightningModule:
    """Re-attach the muP width scaling recorded in ``spec`` to a rebuilt module that lacks it."""
    from lightning_hydro.scaling.width_scaling import WidthScaling, width_scaling_of

    if "width_scaling" in spec and width_scaling_of(module) is None:
        WidthScaling.from_dict(spec["width_scaling"]).attach(module, initialize=False)  # weights come next
    return module


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
            return restore_width_scaling(target(), spec)
        except TypeError as err:
            raise RuntimeError(
                f"{advice}, but {qualname} saved none: call self.save_hyperparameters() in its __init__, or "
                f"pass the trial module to FusedLightningModule(trials=[...], trial_ids=[...]) yourself."
            ) from err
    return restore_width_scaling(target(**spec["hparams"]), spec)


def rebuild_trials(
    specs: Mapping[int, dict[str, Any]],
    known: Mapping[int, L.LightningModule],
    trial_factory: TrialFactory | None = None,
) -> dict[int, L.LightningModule]:
    """Every trial of ``specs``: the ``known`` module where there is one, else rebuilt.

    A missing trial is built by ``trial_factory(id)`` if that returns a module, else from its spec
    (:func:`build_from_spec`); either way its muP width scaling is restored.
    """
    modules = dict(known)
    for tid, spec in specs.items():
        if tid in modules:
            continue
        rebuilt = trial_factory(tid) if trial_factory is not None else None
        modules[tid] = build_from_spec(spec, trial_id=tid) if rebuilt is None else restore_width_scaling(rebuilt, spec)
        build_trial_layers(modules[tid], tid, "a fused group's checkpoint")
    return modules
