"""``Surrogate``: build width / S copies of a model under muP, so that tuned hyperparameters transfer.

The full-size model is muP's base: width multiplier 1, the hyperparameters as given. A surrogate at
width / S has multiplier 1 / S: its readout input is multiplied by S, its matrix-like tensors train at
muP's scaled learning rates (folded into whatever its ``configure_optimizers()`` returns), and its
initialisation is muP's. Hyperparameters that are best for the surrogate are then (close to) best for the
full-size model, which ``build(..., ratio=1)`` builds with the very same hyperparameters.

Example::

    >>> from lightning_hydro.demos.digits import DigitsMLP
    >>> s = Surrogate(lambda **hp: DigitsMLP(**hp), width=["hidden_dim"], ratio=4)
    >>> trials = [s.build(hidden_dim=256, lr=lr) for lr in (0.01, 0.1)]
    >>> trials[0].hparams.hidden_dim, trials[0].width_scaling.width_mult
    (64, 0.25)
    >>> target = s.build(hidden_dim=256, lr=0.1, ratio=1)
    >>> target.hparams.hidden_dim, target.width_scaling.width_mult
    (256, 1.0)
"""

from __future__ import annotations

import collections
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

import torch
from torch import nn

from lightning_hydro.scaling.base_shapes import ModelFactory, find_base_shapes, infshapes, resolve_widths
from lightning_hydro.scaling.multipliers import OptimizerRule, qualified_name
from lightning_hydro.scaling.readout import find_readouts
from lightning_hydro.scaling.width_scaling import WidthScaling

__all__ = ["Surrogate"]


class Surrogate:
    """A recipe for muP-scaled copies of one model at width / ``ratio``.

    Args:
        factory: builds the model from keyword hyperparameters (a class, or ``lambda **hp: Model(**hp)``).
        width: name(s) of the width hyperparameters, the sizes that scale (e.g. ``"hidden_dim"``).
        ratio: default width divisor S of ``build``; it must divide every width.
        readout: names of the readout modules (layers mapping the width to a fixed size, e.g. the output
            head). By default they are found from the shapes; name them when that is ambiguous.
        zero_readout: start readouts at zero, at every ratio including 1 (muP's recommended init: it makes
            the surrogate and the full-size model start from the same function). ``False`` keeps the
            model's own init, rescaled as mup's ``MuReadout`` does.
        optimizer_rules: muP rule (``"adam"`` or ``"sgd"``) of optimizer classes other than torch's Adam,
            AdamW, Adamax, NAdam, RAdam, RMSprop, Adagrad (Adam-like) and SGD, ASGD.

    Raises:
        ValueError: no width keys, a ratio that is not an int >= 1, an unknown optimizer rule.
        TypeError: an optimizer rule keyed by something other than an optimizer class.
    """

    def __init__(
        self,
        factory: ModelFactory,
        width: str | Sequence[str],
        ratio: int = 1,
        *,
        readout: str | Sequence[str] | None = None,
        zero_readout: bool = True,
        optimizer_rules: Mapping[type[torch.optim.Optimizer], OptimizerRule] | None = None,
    ) -> None:
        self.factory = factory
        self.width = (width,) if isinstance(width, str) else tuple(width)
        if not self.width or not all(isinstance(key, str) for key in self.width):
            raise ValueError(
                f"Surrogate: width must name at least one width hyperparameter, got {width!r}; "
                "e.g. width=['hidden_dim']."
            )
        self.ratio = _check_ratio(ratio)
        self.readout = (readout,) if isinstance(readout, str) else None if readout is None else tuple(readout)
        self.zero_readout = zero_readout
        self.optimizer_rules: dict[str, OptimizerRule] = {}
        for cls, rule in (optimizer_rules or {}).items():
            if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
                raise TypeError(
                    f"Surrogate: optimizer_rules must be keyed by optimizer classes, got {cls!r}; "
                    "e.g. optimizer_rules={MyOptimizer: 'adam'}."
                )
            if rule not in get_args(OptimizerRule):
                raise ValueError(
                    f"Surrogate: optimizer rule for {cls.__name__} must be one of {get_args(OptimizerRule)}, "
                    f"got {rule!r}: 'adam' for entrywise-normalised updates, 'sgd' for gradient-proportional "
                    "ones."
                )
            self.optimizer_rules[qualified_name(cls)] = rule

    def build(self, *, ratio: int | None = None, **hparams: Any) -> nn.Module:
        """Build the model at width / ``ratio`` under muP, with ``hparams`` (width values at full size).

        Width hyperparameters not in ``hparams`` take the model's defaults (read from its ``hparams``).

        Raises:
            ValueError: a width key the model does not have or that changes no shape, a ratio that is not an
                int >= 1 or does not divide a width, a model whose readout cannot be found or is ambiguous.
        """
        ratio = self.ratio if ratio is None else _check_ratio(ratio)
        widths = resolve_widths(self.factory, hparams, self.width)
        for key, value in widths.items():
            if value % ratio:
                raise ValueError(
                    f"Surrogate: ratio {ratio} does not divide {key}={value}; the surrogate's {key} would be "
                    f"{value / ratio:g}. Pick a ratio that divides every width (here one of "
                    f"{[d for d in range(1, value + 1) if value % d == 0][:8]}...)."
                )
        base_shapes = find_base_shapes(self.factory, hparams, widths)
        model = self.factory(**{**hparams, **{key: value // ratio for key, value in widths.items()}})
        readouts = find_readouts(model, infshapes(base_shapes, model), self.readout)
        scaling = WidthScaling(ratio, widths, base_shapes, readouts, self.zero_readout, dict(self.optimizer_rules))
        return scaling.attach(model)

    def load_from_checkpoint(self, checkpoint: str | Path | Mapping[str, Any], **hparams: Any) -> nn.Module:
        """Rebuild a surrogate (or target) saved in a Lightning checkpoint, with its trained weights.

        The model is rebuilt from the checkpoint's ``hyper_parameters`` (updated with ``hparams``) at the
        saved ratio, and its ``state_dict`` loaded; its optimizers get the same multipliers as before.

        A path is loaded weights-only (no arbitrary pickled objects), allowing the OmegaConf containers that
        Hydra-instantiated modules keep in their ``hyper_parameters``. To load a checkpoint you trust that
        holds other objects, pass ``torch.load(path, weights_only=False)`` instead of the path.

        Raises:
            ValueError: a checkpoint without a width-scaling record (not saved from a surrogate), or one whose
                objects a weights-only load refuses.
        """
        if not isinstance(checkpoint, Mapping):
            return self.load_from_checkpoint(_load_weights_only(Path(checkpoint)))
        if WidthScaling.CHECKPOINT_KEY not in checkpoint:
            raise ValueError(
                "Surrogate.load_from_checkpoint: the checkpoint has no "
                f"{WidthScaling.CHECKPOINT_KEY!r} record, so it was not saved from a surrogate; load it with "
                "the model class's own load_from_checkpoint."
            )
        scaling = WidthScaling.from_dict(checkpoint[WidthScaling.CHECKPOINT_KEY])
        saved = dict(checkpoint.get("hyper_parameters", {}))
        model = self.factory(**{**saved, **hparams, **{k: v // scaling.ratio for k, v in scaling.widths.items()}})
        scaling.attach(model, initialize=False)
        model.load_state_dict(checkpoint["state_dict"])
        return model

    def __repr__(self) -> str:
        return f"Surrogate(width={list(self.width)}, ratio={self.ratio}, readout={self.readout})"


def _omegaconf_globals() -> list[Any]:
    """What a pickled OmegaConf container refers to (Hydra passes nested configs to modules as these)."""
    try:
        from omegaconf import DictConfig, ListConfig, base, nodes
    except ImportError:  # pragma: no cover - omegaconf comes with Hydra, a dependency
        return []
    node_types = [nodes.AnyNode, nodes.BooleanNode, nodes.BytesNode, nodes.FloatNode, nodes.IntegerNode]
    node_types += [nodes.PathNode, nodes.StringNode]
    return [DictConfig, ListConfig, base.ContainerMetadata, base.Metadata, *node_types, Any, dict, list, int]


def _load_weights_only(path: Path) -> Any:
    """``torch.load(path)`` weights-only, allowing the types a surrogate's Lightning checkpoint may need."""
    allowed = [*_omegaconf_globals(), collections.defaultdict, float, str, bool, tuple]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        refused = sorted(set(torch.serialization.get_unsafe_globals_in_checkpoint(path)) - {_name(t) for t in allowed})
        raise ValueError(
            f"Surrogate.load_from_checkpoint: {path} holds objects that a weights-only load refuses "
            f"({', '.join(refused) or err}). If you trust the file, load it yourself and pass the result: "
            "surrogate.load_from_checkpoint(torch.load(path, weights_only=False))."
        ) from err


def _name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _check_ratio(ratio: Any) -> int:
    if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 1:
        raise ValueError(
            f"Surrogate: ratio must be an int >= 1 (the surrogate is width / ratio), got {ratio!r}. "
            "Use ratio=1 for the full-size model."
        )
    return ratio
