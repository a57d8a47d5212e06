"""The width plan: per module, which dimension is padded for which trial, or why the trials cannot be padded.

Trials of one architecture that differ only in hidden sizes can share one stacked state zero-padded to the
largest size (:mod:`.padding`). That is exact only for *hidden* dimensions: a size that one module produces
and another consumes, through operators that treat a zero unit as absent. The plan checks this from the
trial modules' shapes alone, before anything runs:

- ``Linear`` / ``Conv{1,2,3}d`` (``groups=1``) produce their output features/channels and consume their
  input ones; ``Embedding`` produces its embedding dimension;
- ``BatchNorm{1,2,3}d`` and a one-dimensional ``LayerNorm`` pass their size through (LayerNorm then needs
  a mask so that it normalises over the trial's own width: :mod:`lightning_hydro.backends.padded_vmap`);
- every padded size a module produces must be consumed by another (the same per-trial sizes, or a multiple
  of them, as after flattening ``[C, H, W]`` channels-first), and every consumed one produced: an output layer
  whose size is searched, or an input whose size differs, is refused;
- any other module whose tensors differ in size (``GroupNorm``, ``MultiheadAttention``, recurrent layers,
  a bare ``nn.Parameter``) is refused by name.

What shapes cannot show (a ``view`` to a literal size in ``forward``) fails or differs when the step runs;
the padded backend names that line, and the fused module's first-batch check compares every trial with its
own module.

Example::

    >>> from torch import nn
    >>> def mlp(width: int, classes: int = 10) -> nn.Module:
    ...     return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, classes))
    >>> plan = plan_widths([mlp(16), mlp(32)], ids=[0, 1])
    >>> [str(d) for d in plan.padded]
    ['0: Linear out_features (trial 0: 16, trial 1: 32)', '2: Linear in_features (trial 0: 16, trial 1: 32)']
    >>> plan.refusals
    []
    >>> refusal = plan_widths([mlp(16, 10), mlp(16, 12)], ids=[0, 1]).refusals[0]
    >>> refusal.startswith("module '2' (Linear") and "no later module takes that size in" in refusal
    True
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from torch import nn

__all__ = ["PaddedDimension", "WidthPaddingError", "WidthPlan", "identical_shape_partitions", "plan_widths"]

Role = Literal["produces", "consumes", "passes"]


class WidthPaddingError(ValueError):
    """Trials whose sizes differ in a way that zero-padding would not compute exactly."""


@dataclass(frozen=True)
class PaddedDimension:
    """One size of one module that differs between trials and is padded.

    Attributes:
        path: the module's dotted path in the trial module.
        kind: the module's class name.
        attribute: the size's name (``out_features``, ``in_channels``, ``num_features``...).
        role: whether the module produces, consumes or passes this size through.
        sizes: each trial's size, in the order of the plan's ids.
    """

    path: str
    kind: str
    attribute: str
    role: Role
    sizes: tuple[int, ...]
    ids: tuple[int, ...]

    def __str__(self) -> str:
        shown = ", ".join(f"trial {tid}: {size}" for tid, size in zip(self.ids, self.sizes))
        return f"{self.path}: {self.kind} {self.attribute} ({shown})"


@dataclass
class WidthPlan:
    """What padding does to each module of a group of trials, and what it refuses.

    Attributes:
        ids: the trial ids, in the order of the modules planned.
        padded: every padded size.
        refusals: one line per module that cannot be padded (module, line and reason); empty if the plan holds.
    """

    ids: tuple[int, ...]
    padded: list[PaddedDimension] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)

    @property
    def padded_paths(self) -> frozenset[str]:
        """The modules whose sizes are padded."""
        return frozenset(d.path for d in self.padded)

    def width_of(self, path: str, row: int) -> int | None:
        """The size a pass-through module (e.g. LayerNorm) has for the trial in position ``row``."""
        found = next((d for d in self.padded if d.path == path and d.role == "passes"), None)
        return None if found is None else found.sizes[row]

    def raise_if_refused(self) -> None:
        """Raise :class:`WidthPaddingError` listing every refusal, if there is one."""
        if self.refusals:
            raise WidthPaddingError(
                "These trials differ in sizes that zero-padding would not compute exactly: "
                + "; ".join(self.refusals)
                + ". Fuse only trials of identical shapes (pad_widths=False; "
                "lightning_hydro.stacking.identical_shape_partitions groups them), or search that size separately."
            )

    def summary(self) -> str:
        """One line per padded size, then the refusals."""
        lines = [f"padded {d}" for d in self.padded] + [f"refused {r}" for r in self.refusals]
        return "\n".join(lines) if lines else "nothing to pad: all trials have the same shapes"


_LINEAR = (nn.Linear,)
_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_BATCH_NORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _own_shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    shapes = {name: tuple(p.shape) for name, p in module.named_parameters(recurse=False)}
    shapes.update({name: tuple(b.shape) for name, b in module.named_buffers(recurse=False)})
    return shapes


def _is_torch_class(module: nn.Module) -> bool:
    return type(module).__module__.split(".")[0] == "torch"


def _where(root: nn.Module, path: str) -> str:
    """The module at ``path``, its class, and the line of user code that builds it (or its container).

    The owner is the nearest enclosing module of a class that is not torch's (``Sequential`` is skipped), and
    the line is the first of its ``__init__`` that assigns the attribute leading to the module.
    """
    module = root.get_submodule(path)
    parts = path.split(".")
    for depth in range(len(parts) - 1, -1, -1):
        owner = root.get_submodule(".".join(parts[:depth]))
        if not _is_torch_class(owner):
            break
    attribute = parts[depth] if depth < len(parts) else ""
    try:
        lines, first = inspect.getsourcelines(type(owner).__init__)
        source = inspect.getsourcefile(type(owner)) or "?"
    except (OSError, TypeError):
        return f"module {path!r} ({type(module).__name__}, built by {type(owner).__name__})"
    offset = next((i for i, text in enumerate(lines) if f"self.{attribute}" in text), 0)
    return f"module {path!r} ({type(module).__name__}, built at {source}:{first + offset} in {type(owner).__name__})"


def _sizes(modules: Sequence[nn.Module], path: str, attribute: str) -> tuple[int, ...]:
    return tuple(int(getattr(m.get_submodule(path), attribute)) for m in modules)


def _describe_module(
    path: str, modules: Sequence[nn.Module], ids: tuple[int, ...]
) -> tuple[list[PaddedDimension], str | None]:
    """The padded sizes of one module whose own tensors differ between trials, or why it cannot be padded."""
    first = modules[0].get_submodule(path)
    kind = type(first).__name__

    def dim(attribute: str, role: Role) -> PaddedDimension:
        return PaddedDimension(path, kind, attribute, role, _sizes(modules, path, attribute), ids)

    def differs(attribute: str) -> bool:
        return len(set(_sizes(modules, path, attribute))) > 1

    if isinstance(first, _LINEAR):
        pairs: tuple[tuple[str, Role], ...] = (("out_features", "produces"), ("in_features", "consumes"))
        return [dim(a, r) for a, r in pairs if differs(a)], None
    if isinstance(first, _CONV):
        if any(m.get_submodule(path).groups != 1 for m in modules):
            return [], "a grouped convolution's channel split depends on the padded size"
        if len({tuple(m.get_submodule(path).kernel_size) for m in modules}) > 1:  # type: ignore[arg-type]
            return [], "its kernel size differs between trials (only widths can be padded)"
        channels: tuple[tuple[str, Role], ...] = (("out_channels", "produces"), ("in_channels", "consumes"))
        return [dim(a, r) for a, r in channels if differs(a)], None
    if isinstance(first, _BATCH_NORM):
        return [dim("num_features", "passes")], None
    if isinstance(first, nn.LayerNorm):
        if len(first.normalized_shape) != 1:
            return [], "a LayerNorm over several dimensions cannot be masked to each trial's width"
        shapes = tuple(int(m.get_submodule(path).normalized_shape[0]) for m in modules)  # type: ignore[index]
        return [PaddedDimension(path, kind, "normalized_shape", "passes", shapes, ids)], None
    if isinstance(first, nn.Embedding):
        if differs("num_embeddings"):
            return [], "its number of embeddings (the vocabulary) differs between trials"
        return [dim("embedding_dim", "produces")], None
    if isinstance(first, nn.MultiheadAttention):
        return [], "an attention layer's head split depends on the padded embedding size"
    if isinstance(first, nn.GroupNorm):
        return [], "GroupNorm's groups over a padded channel dimension would mix padding into each group"
    return [], f"{kind} is not a module whose width can be padded (Linear, Conv, BatchNorm, LayerNorm, Embedding)"


def _matches(sizes: tuple[int, ...], other: tuple[int, ...]) -> bool:
    """``other`` equals ``sizes``, or is the same integer multiple of each (a channels-first flatten)."""
    if sizes == other:
        return True
    if any(s == 0 for s in sizes) or any(o % s for o, s in zip(other, sizes)):
        return False
    return len({o // s for o, s in zip(other, sizes)}) == 1


def plan_widths(modules: Sequence[nn.Module], *, ids: Sequence[int]) -> WidthPlan:
    """Plan zero-padding for trial modules that differ in hidden sizes (see the module docstring).

    Args:
        modules: the trial modules, each built at its own width.
        ids: one trial id per module.

    Returns:
        The plan: every padded size, and a refusal per module that cannot be padded (empty if it holds).
    """
    plan = WidthPlan(tuple(int(t) for t in ids))
    if not modules:  # a group whose every trial has stopped
        return plan
    first = modules[0]
    for path, module in first.named_modules():
        shapes = _own_shapes(module)
        if not shapes:
            continue
        if all(_own_shapes(m.get_submodule(path)) == shapes for m in modules[1:]):
            continue
        found, refusal = _describe_module(path, modules, plan.ids)
        if refusal is not None:
            plan.refusals.append(f"{_where(first, path)}: {refusal}")
        plan.padded += found
    produced = [d for d in plan.padded if d.role in ("produces", "passes")]
    consumed = [d for d in plan.padded if d.role in ("consumes", "passes")]
    for out in (d for d in plan.padded if d.role == "produces"):
        if not any(_matches(out.sizes, c.sizes) for c in consumed):
            plan.refusals.append(
                f"{_where(first, out.path)}: its {out.attribute} differs between trials "
                f"({', '.join(str(s) for s in out.sizes)}) and no later module takes that size in: an output whose "
                "size is searched cannot be padded (the loss would see the padded outputs)"
            )
    for into in (d for d in plan.padded if d.role == "consumes"):
        if not any(_matches(p.sizes, into.sizes) for p in produced):
            plan.refusals.append(
                f"{_where(first, into.path)}: its {into.attribute} differs between trials "
                f"({', '.join(str(s) for s in into.sizes)}) and no module produces that size: an input whose "
                "size differs cannot be padded"
            )
    return plan


def identical_shape_partitions(modules: Sequence[nn.Module]) -> list[list[int]]:
    """Positions of the modules grouped by identical parameter and buffer shapes (the fallback to padding)."""
    groups: dict[tuple[tuple[str, tuple[int, ...]], ...], list[int]] = {}
    for position, module in enumerate(modules):
        key = tuple(
            sorted(
                [(n, tuple(p.shape)) for n, p in module.named_parameters()]
                + [(n, tuple(b.shape)) for n, b in module.named_buffers()]
            )
        )
        groups.setdefault(key, []).append(position)
    return list(groups.values())
