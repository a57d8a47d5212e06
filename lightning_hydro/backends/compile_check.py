"""What the ``compile=`` checks share: how far a compiled result is from the eager one, and the random generators.

Each compiled piece of a fused step is checked against the same work run eagerly from the same state, at its
first :data:`CHECKED_CALLS` calls (per fused update, or per graph): the fused update's device work
(:mod:`lightning_hydro.fused.step.compiled_update`), the whole step (:mod:`lightning_hydro.fused.step.whole_step`)
and the split step's forward and backward (:class:`~lightning_hydro.backends.compiled_step.CompiledStep`). They
measure the difference with :func:`group_mismatch`, and put the random number generators back between the two runs
(:func:`rng_states`), so that a step that draws random numbers is recognised: compiled code draws its own, so such
a step is not compared.

Why the first three calls, not only the first: the first step starts from empty optimizer state, while the second
reads state that compiled code wrote (a wrong read of it shows only then); and under ``"reduce-overhead"`` on a
GPU, inductor's CUDA graph trees (``torch/_inductor/cudagraph_trees.py``) run a function's first call as a warm-up,
record its graph at the second and replay the graph from the third, so the three checks see one of each.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Iterable, MutableMapping, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

__all__ = [
    "CHECKED_CALLS",
    "RANDOM",
    "CheckSchedule",
    "drew_random",
    "eager_again",
    "group_mismatch",
    "largest",
    "mismatch",
    "put_back",
    "rng_states",
    "set_rng_states",
    "unique_tensors",
]

T = TypeVar("T")

# each compiled function is checked at this many first calls (per fused update, or per graph; see above)
CHECKED_CALLS = 3

# why a check did not compare
RANDOM = "the step draws random numbers (compiled code draws its own), so it was not compared"


def mismatch(before: Tensor, compiled: Tensor, eager: Tensor, *, relative: float = 1e-3) -> Tensor:
    """How far ``compiled`` is from ``eager``, in units of what float rounding allows (<= 1: the same step).

    Allowed: ``relative`` of the step's change to the tensor (1e-3 by default) plus 1e-6 of its size (inductor
    fuses and reorders the arithmetic); NaNs where both are NaN agree. Not floating point: 0 if equal, else inf.
    A 0-dim float64 tensor (float32 on MPS) on the tensors' device (no host read).
    """
    return group_mismatch([before], [compiled], [eager], relative=relative)


@torch.no_grad()
def group_mismatch(
    before: Sequence[Tensor],
    compiled: Sequence[Tensor],
    eager: Sequence[Tensor],
    *,
    relative: float = 1e-3,
    ignore: Sequence[Tensor | None] = (),
) -> Tensor:
    """:func:`mismatch` of several tensors taken as one (norms over all of them; non-float ones must be equal).

    A tensor whose own change is rounding noise (a bias that BatchNorm cancels, whose gradient is exactly zero in
    theory) is then measured against the change of its whole group, not against its own noise. ``ignore``: per
    tensor, a bool mask of elements left out (None: none).
    """
    device = eager[0].device
    precise = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
    zero = torch.zeros((), dtype=precise, device=device)
    error2, change2, size2, exact = zero, zero, zero, zero
    masks = list(ignore) + [None] * (len(eager) - len(ignore))
    for b, c, e, left_out in zip(before, compiled, eager, masks):
        if not e.is_floating_point():
            exact = torch.maximum(exact, torch.where((c == e).all(), 0.0, float("inf")).to(precise))
            continue
        b, c, e = b.to(precise), c.to(precise), e.to(precise)
        agree = (c == e) | (c.isnan() & e.isnan())
        if left_out is not None:
            agree = agree | left_out
        error2 = error2 + torch.where(agree, 0.0, c - e).square().sum()  # a NaN where eager has none: a NaN error
        change2 = change2 + torch.where(agree, 0.0, e - b).nan_to_num().square().sum()
        size2 = size2 + e.nan_to_num().square().sum()
    error = error2.sqrt()
    ratio = torch.where(error == 0, 0.0, error / (relative * change2.sqrt() + 1e-6 * size2.sqrt()))
    return torch.maximum(ratio.nan_to_num(nan=float("inf"), posinf=float("inf")), exact)


def largest(ratios: Sequence[Tensor], device: torch.device) -> float:
    """The largest of a check's ratios (:func:`group_mismatch`), gathered on ``device``: the check's one host read.

    0.0 when nothing was compared.
    """
    return float(torch.stack([r.to(device) for r in ratios]).max()) if ratios else 0.0


def rng_states(device: torch.device) -> list[Tensor]:
    """The states of the generators a step on ``device`` draws from (the CPU's, and the device's own on CUDA)."""
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


def set_rng_states(device: torch.device, states: list[Tensor]) -> None:
    """Put back what :func:`rng_states` returned."""
    torch.set_rng_state(states[0])
    if device.type == "cuda":
        torch.cuda.set_rng_state(states[1], device)


def drew_random(device: torch.device, states: list[Tensor]) -> bool:
    """Whether a generator moved on since :func:`rng_states` returned ``states`` (the step drew random numbers)."""
    return not all(torch.equal(a, b) for a, b in zip(states, rng_states(device)))


@torch.no_grad()
def put_back(tensors: Sequence[Tensor], values: Sequence[Tensor]) -> None:
    """Copy each of ``values`` into its tensor in ``tensors`` (the state before a compiled run)."""
    for tensor, value in zip(tensors, values):
        tensor.copy_(value)


def eager_again(
    written: Sequence[Tensor],
    before: Sequence[Tensor],
    device: torch.device,
    states: list[Tensor],
    eager: Callable[[], T],
) -> tuple[T, bool]:
    """After a compiled run: ``written`` and the generators put back as they were before it, then ``eager`` run.

    Returns what ``eager`` returned, and whether it drew random numbers (then the two runs cannot be compared).
    """
    put_back(written, before)
    set_rng_states(device, states)
    result = eager()
    return result, drew_random(device, states)


def unique_tensors(tensors: Iterable[Tensor]) -> list[Tensor]:
    """``tensors`` without repeats (by identity), in order: what a check copies and puts back, each once."""
    unique: dict[int, Tensor] = {}
    for tensor in tensors:
        unique.setdefault(id(tensor), tensor)
    return list(unique.values())


class CheckSchedule:
    """Which calls are checked: each key's (a fused update, a graph's key) first :data:`CHECKED_CALLS`.

    Args:
        weak: keys held weakly (a fused update: a slot change replaces it, and its count goes with it).

    Example::

        >>> schedule = CheckSchedule()
        >>> [schedule.take("graph") for _ in range(4)]
        [1, 2, 3, 0]
    """

    def __init__(self, weak: bool = False) -> None:
        self.weak = weak
        self._done: MutableMapping[Any, int] = weakref.WeakKeyDictionary() if weak else {}

    def due(self, key: Hashable) -> bool:
        """Whether the next call of ``key`` is checked."""
        return self._done.get(key, 0) < CHECKED_CALLS

    def take(self, key: Hashable) -> int:
        """Count a check of ``key``'s call: its number (1 for the first), or 0 if none was due."""
        if not self.due(key):
            return 0
        done = self._done[key] = self._done.get(key, 0) + 1
        return done

    def __getstate__(self) -> dict[str, Any]:
        """Weak keys are not pickled (``ddp_spawn`` pickles the module): their counts start again."""
        return {"weak": self.weak, "_done": {} if self.weak else dict(self._done)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.weak = state["weak"]
        self._done = weakref.WeakKeyDictionary() if self.weak else dict(state["_done"])
