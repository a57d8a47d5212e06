"""The ``hfta`` backend: vmap over the trials, with the heavy modules swapped for fused operators.

It runs exactly like the ``vmap`` backend (the user's own step code under ``torch.func.vmap``), but the
template is first converted by :func:`~lightning_hydro.backends.hfta.convert_to_fused`: Linear,
convolutions, normalisation, embedding, attention, dropout and PReLU become operators with explicit
HFTA layouts (``baddbmm`` on ``[B, N, F]``, grouped convolutions on ``[N, B*C, H, W]``) whose batching
rules replace vmap's generic ones, and whose per-trial Python settings (BatchNorm momentum, dropout p,
LeakyReLU slope, Embedding ``padding_idx``...) really are per trial. See docs/hfta.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import lightning as L
from torch import nn
from typing_extensions import override

from lightning_hydro.backends.compiled_step import CompileSetting
from lightning_hydro.backends.errors import FusionError
from lightning_hydro.backends.hfta import ConversionError, convert_to_fused, plan_conversion
from lightning_hydro.backends.hfta.registry import FUSED_OPERATORS
from lightning_hydro.backends.python_state import copy_template
from lightning_hydro.backends.trial_attributes import settings_fingerprint
from lightning_hydro.backends.vmap_backend import VmapBackend

if TYPE_CHECKING:
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["HftaBackend"]


@contextmanager
def _conversion_errors_as_fusion_errors() -> Iterator[None]:
    """What the conversion rejects is a FusionError for the fused module (auto then falls back)."""
    try:
        yield
    except ConversionError as err:
        raise FusionError(f"backend='hfta' cannot convert these trials: {err}") from err


def _is_prefix(prefix: str, path: str) -> bool:
    return not prefix or path == prefix or path.startswith(prefix + ".")


class HftaBackend(VmapBackend):
    """vmap over a template converted into fused operators; reconverted whenever the trials change.

    Raises:
        FusionError: at construction, if a module cannot be converted (the message names each one).
        FusionMismatchError: at construction, if the trials differ in Python values that code outside the
            fused operators reads (the LightningModule's own attributes and hparams, containers).
    """

    name = "hfta"

    def __init__(self, group: StackedState, *, chunk_size: int | None = None, compile: CompileSetting = False) -> None:
        self._converted: nn.Module | None = None
        self._converted_settings: list[dict[tuple[str, str], Any]] = []
        with _conversion_errors_as_fusion_errors():
            plan_conversion(group.modules[0], group.modules).raise_if_rejected()
        super().__init__(group, chunk_size=chunk_size, compile=compile)

    @override
    def per_trial_settings(self, modules: Sequence[nn.Module]) -> Callable[[str], bool]:
        # a fused operator or a per-group module honours its own settings per trial (and its children's);
        # containers and the LightningModule itself run their Python code with the template's values
        template = modules[0]
        honoured = [
            decision.path
            for decision in plan_conversion(template, modules).decisions
            if decision.outcome == "grouped"
            or (decision.outcome == "fused" and type(template.get_submodule(decision.path)) in FUSED_OPERATORS)
        ]
        return lambda path: any(_is_prefix(prefix, path) for prefix in honoured)

    @override
    def check_settings(self) -> bool:
        if not super().check_settings():
            return False
        # the fused operators took each trial's settings when converted: settings a hook changed since need a
        # new conversion (cheap: a copy and some attributes)
        if self._converted is not None and settings_fingerprint(self.group.modules) != self._converted_settings:
            self._converted = None
        return True

    @override
    def template(self) -> nn.Module:
        first = self.group.modules[0]
        if self._converted is None:
            with _conversion_errors_as_fusion_errors():
                self._converted = convert_to_fused(copy_template(first), self.group.modules, inplace=True)
            self._converted_settings = settings_fingerprint(self.group.modules)
        converted = self._converted
        # the copy follows the trial modules: train/eval mode (per submodule) and the Trainer the user's code uses
        modes = {name: module.training for name, module in first.named_modules()}
        for name, module in converted.named_modules():
            module.training = modes.get(name, first.training)
        if isinstance(first, L.LightningModule) and isinstance(converted, L.LightningModule):
            converted.trainer = first._trainer  # a converted copy loses it
        return converted

    @override
    def rebind(self) -> None:
        super().rebind()
        self._converted = None  # new rows or devices: convert again (cheap: a copy and some attributes)
