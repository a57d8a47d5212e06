"""Base shapes: which dimension of each parameter scales with width, found by building the model twice.

muP needs, for every parameter, the size each dimension has in the full-size (base) model and whether it
grows with width. As mup's ``make_base_shapes`` does, this builds the model at its full width and again
with one width hyperparameter doubled, and compares the shapes: a dimension that changed is a width
dimension. The probes are built on the ``meta`` device, so they cost no memory and no initialisation.

Example::

    >>> from lightning_hydro.demos.digits import DigitsMLP
    >>> base = find_base_shapes(DigitsMLP, {"depth": 1}, {"hidden_dim": 64})
    >>> base["body.0.weight"], base["head.weight"], base["head.bias"]
    ((64, None), (None, 64), (None,))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from mup import InfShape, zip_infshapes
from torch import nn

__all__ = ["BaseShape", "ModelFactory", "find_base_shapes", "infshapes", "parameter_shapes", "resolve_widths"]

ModelFactory = Callable[..., nn.Module]
"""Builds the model from keyword hyperparameters, e.g. ``lambda **hp: MyModule(**hp)`` or ``MyModule``."""

BaseShape = tuple[int | None, ...]
"""Per dimension: its size in the full-size model if it scales with width, else ``None`` (a fixed size)."""


def build_on_meta(factory: ModelFactory, hparams: Mapping[str, Any]) -> nn.Module:
    """Build the model on the ``meta`` device: parameters get shapes but no memory and no initialisation.

    A model whose ``__init__`` needs real tensors (it reads data, calls ``.item()``) cannot be built on
    ``meta``; it is then built normally. Only its shapes are used, so the result is the same.
    """
    try:
        with torch.device("meta"):
            return factory(**hparams)
    except TypeError:
        raise  # a wrong keyword is the caller's to report; building normally would fail the same way
    except Exception:
        return factory(**hparams)


def parameter_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Shape of every parameter of ``model`` by name (shared parameters once, under their first name)."""
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def resolve_widths(factory: ModelFactory, hparams: Mapping[str, Any], width_keys: Sequence[str]) -> dict[str, int]:
    """Full-size value of every width hyperparameter.

    Taken from ``hparams`` where given, otherwise from the model built with ``hparams``: its Lightning
    ``hparams`` (recorded by ``save_hyperparameters()``) or an attribute of the same name.

    Raises:
        ValueError: a width key that neither ``hparams`` nor the model knows, or whose value is not a
            positive int.
    """
    missing = [key for key in width_keys if key not in hparams]
    widths = {key: hparams[key] for key in width_keys if key in hparams}
    if missing:
        model = _build(factory, hparams)
        recorded = dict(getattr(model, "hparams", {}) or {})
        for key in missing:
            if key in recorded:
                widths[key] = recorded[key]
            elif isinstance(getattr(model, key, None), int):
                widths[key] = getattr(model, key)
            else:
                known = sorted(recorded) or "none recorded"
                raise ValueError(
                    f"Surrogate: width key {key!r} is not a hyperparameter of the model: it was not passed "
                    "to build() and the model has no hparam or attribute of that name (its hparams: "
                    f"{known}). Fix the name in width=[...], or pass the full-size value, e.g. "
                    f"build({key}=256)."
                )
    for key in width_keys:
        value = widths[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"Surrogate: width hyperparameter {key!r} must be a positive int, got {value!r}. "
                "Width keys name the sizes that muP scales (e.g. hidden_dim, d_model)."
            )
    return {key: widths[key] for key in width_keys}


def find_base_shapes(
    factory: ModelFactory, hparams: Mapping[str, Any], widths: Mapping[str, int]
) -> dict[str, BaseShape]:
    """Base shape of every parameter of the full-size model built with ``hparams`` and ``widths``.

    Raises:
        ValueError: a width key that changes no parameter shape, or that adds or removes parameters.
    """
    full = {**hparams, **widths}
    shapes = parameter_shapes(_build(factory, full))
    scales: dict[str, list[bool]] = {name: [False] * len(shape) for name, shape in shapes.items()}
    for key, value in widths.items():
        probe = parameter_shapes(_build(factory, {**full, key: 2 * value}))
        if set(probe) != set(shapes):
            raise ValueError(
                f"Surrogate: changing width key {key!r} from {value} to {2 * value} adds or removes "
                f"parameters (only at one width: {sorted(set(probe) ^ set(shapes))[:5]}). A width key "
                "may only change sizes, not the set of layers; keep such hyperparameters out of width=[...]."
            )
        changed = False
        for name, shape in shapes.items():
            if len(probe[name]) != len(shape):
                raise ValueError(
                    f"Surrogate: changing width key {key!r} changes the number of dimensions of {name!r} "
                    f"({shape} -> {probe[name]}); a width key may only change sizes."
                )
            for dim, (size, probe_size) in enumerate(zip(shape, probe[name])):
                if size != probe_size:
                    scales[name][dim] = changed = True
        if not changed:
            raise ValueError(
                f"Surrogate: width key {key!r} does not change any parameter shape ({key}={value} and "
                f"{key}={2 * value} build the same shapes), so muP has nothing to scale. Name the "
                "hyperparameters that set layer sizes (e.g. hidden_dim, d_model) in width=[...]."
            )
    return {
        name: tuple(size if scales[name][dim] else None for dim, size in enumerate(shape))
        for name, shape in shapes.items()
    }


def infshapes(base_shapes: Mapping[str, BaseShape], model: nn.Module) -> dict[str, InfShape]:
    """The mup ``InfShape`` of every parameter of ``model`` (a surrogate) against its base shapes.

    Raises:
        ValueError: ``model`` has parameters the base shapes do not know, or lacks some they list.
    """
    shapes = parameter_shapes(model)
    if set(shapes) != set(base_shapes):
        raise ValueError(
            "Surrogate: the model's parameters differ from those its base shapes were found for "
            f"(only in the model: {sorted(set(shapes) - set(base_shapes))[:5]}, only in the base shapes: "
            f"{sorted(set(base_shapes) - set(shapes))[:5]}). Build the model with the same non-width "
            "hyperparameters it was probed with."
        )
    base = {name: InfShape.from_base_shape(list(shape)) for name, shape in base_shapes.items()}
    return zip_infshapes(base, shapes)


def _build(factory: ModelFactory, hparams: Mapping[str, Any]) -> nn.Module:
    try:
        return build_on_meta(factory, hparams)
    except TypeError as err:
        raise ValueError(
            f"Surrogate: building the model with {dict(hparams)} failed: {err}. Check that every width "
            "key and hyperparameter is an argument of the model factory."
        ) from err
