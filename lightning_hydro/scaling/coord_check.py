"""Coordinate check: do activation sizes stay put as width grows? The test that muP is wired up right.

Train models of several widths for a few steps and record, after each step, the mean absolute value of
every layer's output on the step's batch. Under muP the curves are flat in width; under standard
parametrization they grow (or shrink) with it, and the larger the width the sooner training blows up.

Several models per width (a fused group, stacked trials) are measured one by one through their own
modules: trial modules bound to slices of a stacked tensor see the stacked weights, so only the update
changes. ``update`` says how models are trained: by default each with its own optimizer; pass a function
that steps a fused group instead.

Example::

    >>> import torch
    >>> from lightning_hydro.scaling import Surrogate
    >>> from lightning_hydro.demos.digits import DigitsMLP
    >>> s = Surrogate(DigitsMLP, width=["hidden_dim"])
    >>> batches = [(torch.rand(32, 64), torch.randint(0, 10, (32,))) for _ in range(3)]
    >>> check = coord_check(lambda w: s.build(hidden_dim=256, ratio=256 // w, optimizer="adam", lr=0.01),
    ...                     widths=[64, 128, 256], batches=batches, steps=2)
    >>> check.widths(), check.steps()
    ([64, 128, 256], [0, 1, 2])
    >>> check.spread("body.1", step=2) < 2.0
    True
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightning_hydro.scaling.param_groups import find_optimizers

__all__ = [
    "ActivationSize",
    "CoordCheck",
    "UpdateFactory",
    "activation_sizes",
    "coord_check",
    "per_model_update",
    "plot_coord_checks",
]

UpdateFactory = Callable[[Sequence[nn.Module]], Callable[[Any], None]]
"""Given the models of one width, returns ``update(batch)``, which trains them all one step on ``batch``."""


@dataclass(frozen=True)
class ActivationSize:
    """Mean absolute output of one layer of one model, after ``step`` updates."""

    width: int
    step: int
    layer: str
    size: float
    trial: int = 0


def activation_sizes(module: nn.Module, inputs: Any) -> dict[str, float]:
    """Mean absolute value of every submodule's output in one forward pass of ``module`` on ``inputs``.

    Submodules returning a tuple are measured on its first tensor; those returning no tensor are skipped.
    """
    sizes: dict[str, float] = {}
    handles = []
    for name, layer in module.named_modules():
        if not name:
            continue

        def record(layer: nn.Module, args: Any, output: Any, name: str = name) -> None:
            tensor = output[0] if isinstance(output, tuple | list) and output else output
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                sizes[name] = float(tensor.detach().abs().mean())

        handles.append(layer.register_forward_hook(record))
    try:
        with torch.no_grad():
            module(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return sizes


def per_model_update(models: Sequence[nn.Module]) -> Callable[[Any], None]:
    """Default update: each model's first ``configure_optimizers()`` optimizer on its ``training_step`` loss.

    What ``training_step`` logs is dropped (there is no Trainer to log to).
    """
    optimizers = []
    for model in models:
        found, _ = find_optimizers(model.configure_optimizers())  # type: ignore[operator]
        if not found:
            raise ValueError(
                f"coord_check: {type(model).__name__}.configure_optimizers() returned no optimizer; "
                "return one, or pass update=... to train the models yourself."
            )
        optimizers.append(found[0])
    count = [0]

    def update(batch: Any) -> None:
        for model, optimizer in zip(models, optimizers):
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*self.log.*")
                loss = model.training_step(batch, count[0])  # type: ignore[operator]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        count[0] += 1

    return update


def coord_check(
    build: Callable[[int], nn.Module | Sequence[nn.Module]],
    widths: Sequence[int],
    batches: Sequence[Any],
    *,
    steps: int = 3,
    update: UpdateFactory = per_model_update,
    inputs: Callable[[Any], Any] | None = None,
) -> CoordCheck:
    """Record every layer's activation size, at each width, before training and after each of ``steps`` steps.

    Args:
        build: a fresh model (or several, e.g. the trials of a fused group) of the given width.
        widths: the widths to compare.
        batches: training batches; step ``t`` trains on ``batches[t % len(batches)]`` and is measured on it.
        steps: number of updates.
        update: how the models of one width are trained (see ``UpdateFactory``).
        inputs: what the model's forward takes from a batch; default: its first element.

    Raises:
        ValueError: no widths, no batches, or a negative number of steps.
    """
    if not widths or not batches or steps < 0:
        raise ValueError(
            f"coord_check: needs at least one width and one batch and steps >= 0, got {len(widths)} widths, "
            f"{len(batches)} batches and steps={steps}."
        )
    select = inputs or (lambda batch: batch[0] if isinstance(batch, tuple | list) else batch)
    records: list[ActivationSize] = []
    for width in widths:
        built = build(width)
        models = [built] if isinstance(built, nn.Module) else list(built)
        step_models = update(models)
        for step in range(steps + 1):
            batch = batches[step % len(batches)]
            for trial, model in enumerate(models):
                for layer, size in activation_sizes(model, select(batch)).items():
                    records.append(ActivationSize(width, step, layer, size, trial))
            if step < steps:
                step_models(batch)
    return CoordCheck(tuple(records))


@dataclass(frozen=True)
class CoordCheck:
    """The records of one ``coord_check`` run, with the summaries a test or a plot needs."""

    records: tuple[ActivationSize, ...]

    def widths(self) -> list[int]:
        """The widths checked, ascending."""
        return sorted({r.width for r in self.records})

    def steps(self) -> list[int]:
        """The steps recorded, from 0 (at initialisation)."""
        return sorted({r.step for r in self.records})

    def layers(self) -> list[str]:
        """The layers measured, in the order they first ran."""
        return list(dict.fromkeys(r.layer for r in self.records))

    def sizes(self, layer: str, step: int) -> dict[int, float]:
        """Activation size of ``layer`` after ``step`` updates, by width (mean over trials).

        Raises:
            KeyError: a layer or step that was not recorded.
        """
        by_width: dict[int, list[float]] = {}
        for r in self.records:
            if r.layer == layer and r.step == step:
                by_width.setdefault(r.width, []).append(r.size)
        if not by_width:
            raise KeyError(
                f"CoordCheck.sizes: no records for layer {layer!r} at step {step}; layers: {self.layers()}, "
                f"steps: {self.steps()}."
            )
        return {width: sum(v) / len(v) for width, v in sorted(by_width.items())}

    def spread(self, layer: str, step: int) -> float:
        """Largest over smallest activation size of ``layer`` across widths (1.0: width-independent)."""
        values = list(self.sizes(layer, step).values())
        return max(values) / min(values) if min(values) > 0 else float("inf")

    def growth(self, layer: str, step: int) -> float:
        """Activation size of ``layer`` at the largest width over that at the smallest."""
        values = list(self.sizes(layer, step).values())
        return values[-1] / values[0] if values[0] > 0 else float("inf")

    def plot(self, path: str | Path, *, layers: Sequence[str] | None = None, title: str = "") -> Path:
        """Plot activation size against width, one panel per step (see ``plot_coord_checks``)."""
        return plot_coord_checks({title: self}, path, layers=layers)


def plot_coord_checks(
    checks: Mapping[str, CoordCheck], path: str | Path, *, layers: Sequence[str] | None = None
) -> Path:
    """One row per check (e.g. ``{"muP": ..., "standard": ...}``), one panel per step, one line per layer.

    Needs matplotlib (``pip install 'lightning-hydro[examples]'``). Returns the path written.
    """
    try:
        import matplotlib
        import matplotlib.ticker

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("plot_coord_checks needs matplotlib: pip install 'lightning-hydro[examples]'.") from err
    steps = max(len(check.steps()) for check in checks.values())
    fig, axes = plt.subplots(len(checks), steps, figsize=(3.6 * steps, 3.2 * len(checks)), squeeze=False)
    for row, (name, check) in zip(axes, checks.items()):
        for ax, step in zip(row, check.steps()):
            for layer in layers or check.layers():
                sizes = check.sizes(layer, step)
                ax.plot(list(sizes), list(sizes.values()), marker=".", label=layer)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(check.widths(), [str(w) for w in check.widths()])
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set(xlabel="width", title=f"{name} step {step}".strip())
        row[0].set_ylabel("mean |activation|")
    axes[0][-1].legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
