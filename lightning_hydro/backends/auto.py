"""``backend="auto"``: time a few real training steps of each applicable backend and keep the fastest.

The candidates run forward and backward on the real first batch (no optimizer step), after one warm-up
call; buffers (e.g. BatchNorm running statistics), gradients, the random number generators and the trials'
Python state (counters, outputs lists: :mod:`~lightning_hydro.backends.python_state`) are put back
afterwards, so the choice does not change what the trials compute. A backend that cannot run the
model (a :class:`~lightning_hydro.backends.errors.FusionError`, or any other error of a fused backend) is
skipped with its reason, which the fused module logs; only the ``loop`` backend's own errors propagate.
Choices are cached per (model class, number of trials, parameter shapes, device) for the life of the process,
except a choice that a candidate's refusal of this group's values decided (a
:class:`~lightning_hydro.backends.errors.FusionMismatchError`: trials that differ in a value the step reads); a
group that refuses the cached choice has the candidates timed again, as in a fresh process.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from lightning_hydro.backends.base import Backend
from lightning_hydro.backends.errors import FusionError, FusionMismatchError
from lightning_hydro.backends.python_state import PythonState

if TYPE_CHECKING:
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["AutoChoice", "choose_backend", "clear_backend_cache"]

_CACHE: dict[tuple[object, ...], str] = {}


@dataclass
class AutoChoice:
    """The chosen backend, the measured median seconds per step of each candidate, and why others failed."""

    backend: Backend
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    cached: bool = False
    timed: bool = True
    margin: float = 0.0  # see choose_backend
    order: list[str] = field(default_factory=list)  # the candidates in order of preference
    trials: int = 0  # the group's size
    side_by_side: int | None = None  # separate runs the device runs at once at full speed, where known (CPU cores)
    eligible: list[str] | None = None  # the candidates it may choose when one of them runs (None: every one)
    why_eligible: str = ""  # why only those (e.g. compile applies to the fused backends)

    def describe(self) -> str:
        """One line saying what was chosen and the measured step times."""
        if not self.timed:
            text = f"backend='auto' (deterministic) chose {self.backend.name!r}, the first that runs the model"
            for name, why in self.skipped.items():
                text += f"; {name} skipped: {why.splitlines()[0]}"
            return text
        if self.cached:
            return f"backend='auto' reused its earlier choice {self.backend.name!r} for this model"
        if not self.seconds:
            return f"backend='auto' chose {self.backend.name!r}, the only backend that can run this model"
        timings = ", ".join(f"{name} {1000 * s:.2f} ms" for name, s in sorted(self.seconds.items(), key=lambda i: i[1]))
        text = (
            f"backend='auto' chose {self.backend.name!r} (forward+backward per step on the first batch: {timings}; "
            f"{self._margin_rule()})"
        )
        for name, why in self.skipped.items():
            text += f"; {name} skipped: {why.splitlines()[0]}"
        return text + self._against_separate_runs()

    def _against_separate_runs(self) -> str:
        """What the timings say against the alternative of running the trials as separate concurrent processes.

        The loop's time is the trials' steps one after another, so ``loop / chosen`` is what fusing gains over
        that. Separate processes side by side gain at most the number the device runs at once at full speed:
        on a CPU its cores (one thread each, for a model this small); on an accelerator it is not known here.
        """
        chosen = self.backend.name
        if self.trials < 2 or "loop" not in self.seconds or chosen not in self.seconds:
            return ""
        gain = self.seconds["loop"] / self.seconds[chosen]
        text = f"; fused, the {self.trials} trials step {gain:.1f}x as fast as one after another"
        if self.side_by_side is None:
            return text + f" (separate concurrent runs beat that only where the device runs over {gain:.1f} at once)"
        at_once = min(self.side_by_side, self.trials)
        if at_once < 2 or at_once <= gain:
            return text
        return text + (
            f"; this machine's {self.side_by_side} cores could run {at_once} of them side by side, one thread each: "
            f"separate concurrent runs (e.g. hydra/launcher=joblib with n_jobs={at_once}) would likely be faster"
        )

    def _margin_rule(self) -> str:
        """Why the chosen backend won: the first in order of preference within ``margin`` of the fastest."""
        pool = self._pool()
        order = ", ".join(name for name in self.order if name in pool)
        of_them = "" if len(pool) == len(self.seconds) else " of them"
        rule = (
            f"auto keeps the first of {order} whose time is within {self.margin:.0%} of the fastest{of_them}, so "
            "that timing noise does not flip the choice"
        )
        if of_them:
            rule = f"{self.why_eligible}: {rule}"
        fastest = min(pool, key=pool.__getitem__)
        chosen = self.backend.name
        if fastest != chosen and chosen in pool:
            slower = pool[chosen] / pool[fastest] - 1.0
            rule += f": {chosen} took {slower:.1%} longer than {fastest}"
        return rule

    def _pool(self) -> dict[str, float]:
        """The timed candidates the choice was made among: the eligible ones that ran, else every one that ran."""
        if self.eligible is None:
            return self.seconds
        pool = {name: s for name, s in self.seconds.items() if name in self.eligible}
        return pool or self.seconds


def _cores(device: torch.device) -> int | None:
    """How many separate single-threaded runs the device runs at once: a CPU's usable cores (else unknown)."""
    if device.type != "cpu":
        return None
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def clear_backend_cache() -> None:
    """Forget earlier automatic choices (e.g. after changing threads or devices)."""
    _CACHE.clear()


def _cache_key(group: StackedState) -> tuple[object, ...]:
    first = next(iter(group.params.values()))
    shapes = tuple((name, tuple(p.shape)) for name, p in group.params.items())
    return (type(group.modules[0]).__qualname__, group.size, shapes, str(first.device), first.dtype)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def choose_backend(
    group: StackedState,
    candidates: Sequence[tuple[str, Callable[[], Backend]]],
    run_step: Callable[[Backend], None],
    *,
    repeats: int = 3,
    timed: bool = True,
    margin: float = 0.1,
    eligible: Collection[str] | None = None,
    why_eligible: str = "",
) -> AutoChoice:
    """Time ``run_step(backend)`` for each candidate and return the fastest.

    With ``timed=False`` the choice does not depend on timings (so not on machine load): the first
    candidate, in the order given, that runs one step; the process-wide cache is neither read nor written.
    A cached choice that this group refuses (its trials differ in a value the step reads) is skipped, and the
    others are timed; a choice that such a refusal decided is not cached.

    Args:
        group: the stacked state (its buffers are restored after each candidate).
        candidates: ``(name, factory)`` pairs, in order of preference on ties.
        run_step: one forward+backward with the given backend (gradients accumulate in the stacked state).
        repeats: timed calls per candidate after one warm-up call; the median counts.
        timed: pick the fastest (True) or the first that runs (False).
        margin: a later candidate must be this much faster than an earlier one to be chosen (0.1: 10%), so
            that timing noise on a loaded machine does not flip the choice between near-equal backends.
        eligible: the candidates to choose among when one of them runs; the others are timed too (the report
            weighs fusion against them) and chosen only when none of these can run. None: every candidate.
        why_eligible: why only those, said in the report (e.g. ``"compile=True applies to hfta and vmap"``).

    Raises:
        FusionError: if no candidate can run the model (the last reason is re-raised).
        Exception: whatever the ``loop`` candidate raises (the trials' own code fails).
    """
    factories = dict(candidates)
    if len(factories) == 1:  # nothing to compare: no timing runs (they could update user state, e.g. metrics)
        ((name, factory),) = factories.items()
        return AutoChoice(factory(), skipped={}, seconds={})
    key = (*_cache_key(group), None if eligible is None else tuple(sorted(eligible)))
    refused: dict[str, str] = {}  # the cached choice, where this group's trials refuse it: timed again below
    if timed and key in _CACHE and _CACHE[key] in factories:
        cached = _CACHE[key]
        try:
            return AutoChoice(factories[cached](), cached=True)
        except FusionError as err:  # e.g. these trials differ in a value the step reads, the earlier group's did not
            refused[cached] = str(err)
    device = group.device
    saved_buffers = group.saved_buffers()
    python_state = PythonState(group.modules)  # counters, outputs lists...: every candidate starts from them
    choice = AutoChoice(
        backend=None,  # type: ignore[arg-type]  # set below, once the fastest is known
        timed=timed,
        margin=margin,
        order=list(factories),
        trials=group.size,
        side_by_side=_cores(device),
        eligible=None if eligible is None else [name for name in factories if name in eligible],
        why_eligible=why_eligible,
    )
    choice.skipped.update(refused)
    last_error: FusionError | None = None
    # a candidate that refuses these trials' values (FusionMismatchError) says nothing of another group of the
    # class: such a choice is not cached, and the earlier one stays for the groups whose trials agree
    mismatch = bool(refused)
    built: dict[str, Backend] = {}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for name, factory in candidates:
            if name in refused:
                continue
            try:
                backend = factory()
                times: list[float] = []
                for i in range(repeats + 1 if timed else 1):  # untimed: one step shows that it runs
                    _synchronize(device)
                    start = time.perf_counter() if timed else 0.0
                    run_step(backend)
                    _synchronize(device)
                    if i:  # the first call warms up
                        times.append(time.perf_counter() - start)
                choice.seconds[name] = statistics.median(times) if times else 0.0
                built[name] = backend
                if not timed and (eligible is None or name in eligible):
                    break
            except FusionError as err:
                choice.skipped[name] = str(err)
                last_error = err
                mismatch = mismatch or isinstance(err, FusionMismatchError)
            except Exception as err:
                if name == "loop":
                    raise  # the trials' own code fails on its own: a bug of the step, not of fusion
                # a fused backend that fails in any other way is skipped too: the loop runs what it cannot
                choice.skipped[name] = f"{type(err).__name__}: {err}"
            finally:
                group.restore_buffers(saved_buffers)
                for param in group.params.values():
                    param.grad = None
                python_state.restore()
    if not choice.seconds:
        assert last_error is not None
        raise last_error
    # the error's traceback holds this frame (and its callers'), which holds the error: a cycle that would
    # keep the tensors of the step being run (its autograd graph included) alive until the collector runs
    del last_error
    pool = choice._pool()
    best = min(pool.values())
    fastest = next(n for n in pool if pool[n] <= best * (1.0 + margin))  # in preference order
    choice.backend = built[fastest]
    if timed and not mismatch:
        _CACHE[key] = fastest
    return choice
