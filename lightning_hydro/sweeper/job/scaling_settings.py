"""The ``scaling`` section of an app config: search muP surrogates at width / ratio, retrain at full size.

.. code-block:: yaml

    scaling:
      width: [hidden_dim]   # the model's width hyperparameters ("model.hidden_dim" works too)
      ratio: 4              # search trials are width / 4 surrogates; the final retrain is full size

Example::

    >>> from omegaconf import OmegaConf
    >>> model = OmegaConf.create({"_target_": "lightning_hydro.demos.DigitsMLP", "hidden_dim": 128, "lr": 0.1})
    >>> settings = ScalingSettings.from_config(OmegaConf.create({"width": ["model.hidden_dim"], "ratio": 4}))
    >>> settings.build(model).hparams.hidden_dim
    32
    >>> ScalingSettings.from_config(None).build(model).hparams.hidden_dim
    128
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import lightning as L
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

__all__ = ["ScalingSettings"]


@dataclass(frozen=True)
class ScalingSettings:
    """Width hyperparameter names and the ratio S; no width names: build models as configured."""

    width: tuple[str, ...] = ()
    ratio: int = 1

    @classmethod
    def from_config(cls, node: Any, *, full_size: bool = False) -> ScalingSettings:
        """Read the ``scaling`` section (None: no scaling); ``full_size`` builds targets (ratio 1).

        Raises:
            ValueError: a section without ``width``, or with unknown keys.
        """
        if node is None:
            return cls()
        section = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
        if not isinstance(section, Mapping) or "width" not in section or set(section) - {"width", "ratio"}:
            raise ValueError(
                f"fit_from_config: the 'scaling' section needs 'width' (the model's width hyperparameters) and "
                f"optionally 'ratio', got {section!r}. Fix: e.g. scaling: {{width: [hidden_dim], ratio: 4}}."
            )
        width = section["width"]
        names = (width,) if isinstance(width, str) else tuple(width)
        names = tuple(name.removeprefix("model.") for name in names)
        return cls(width=names, ratio=1 if full_size else int(section.get("ratio", 1)))

    def build(self, model_cfg: DictConfig) -> L.LightningModule:
        """Instantiate the configured model, as a width / ratio muP surrogate when widths are named."""
        if not self.width:
            return instantiate(model_cfg)
        from lightning_hydro.scaling import Surrogate

        container = OmegaConf.to_container(model_cfg, resolve=True)
        assert isinstance(container, dict)  # a model section is a mapping (checked by fit_from_config)
        hparams = {str(k): v for k, v in container.items() if k != "_target_"}
        cls = get_class(str(model_cfg["_target_"]))
        return Surrogate(cls, width=self.width, ratio=self.ratio).build(**hparams)  # type: ignore[return-value]
