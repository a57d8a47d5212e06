"""``RowHealth``: which rows of a fused group are healthy, kept on the device and read back when needed.

A training step must not wait for the device to answer "did any trial diverge?": on a GPU that wait (a host
sync) costs more than the step of a small model. So each step only *records*, as ``[B]`` device tensors,
whether a row's loss was finite (:meth:`RowHealth.record_losses`) and, from the optimizer's
:class:`~lightning_hydro.optim.group_optimizer.StepReport` (:meth:`RowHealth.absorb`), at which optimizer step
a row was first skipped and why: the report's two ``[B]`` masks are kept, no device op per step, and counted at the
read-back (a row once skipped stays skipped until then, so counting its skipped steps dates its divergence).

A row that went bad stays skipped (its last finite weights are kept) until the fused module reads everything
back in one sync (:meth:`RowHealth.read`) and frees its slot: at the end of each training epoch, before a
checkpoint, when the group's rows change, and at optimizer steps 1, 2, 4, ... up to ``check_every`` and every
``check_every`` steps after that (a diverging trial usually blows up in its first steps; the early checks free
its slot, or end a fit whose trials all diverged, at once).

By default ``check_every`` is 1 on the CPU and 32 elsewhere. A read costs a wait only where the device runs
ahead of the host (CUDA, MPS, XLA): on the CPU every op has finished when it returns, so the group is read
back after every step there, and a diverged trial leaves the group at once, as on every device before. On an
accelerator the trial stays in the group, skipped, until the read-back; its neighbours' values never depend on
its values, but the batched kernels run on one more row meanwhile, which can change their float rounding.

Example::

    >>> import torch
    >>> health = RowHealth(check_every=4)
    >>> health.record_losses([3, 7], torch.tensor([0.5, float("nan")])).tolist()  # which losses are not finite
    [False, True]
    >>> health.rows_to_skip([3, 7]).tolist()
    [False, True]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_hydro.fused.step.fused_update import not_finite
from lightning_hydro.optim.group_optimizer import StepReport

__all__ = ["HealthReadback", "RowHealth", "sum_of_finite"]

_REASONS = {1: "non-finite loss", 2: "non-finite gradients"}


def sum_of_finite(losses: Tensor, bad: Tensor) -> Tensor:
    """The loss Lightning runs backward on: the sum of the ``[B]`` losses, the ``bad`` rows' left out.

    A sum, not a mean, so that each trial's gradient is its own; a bad row (a non-finite loss) adds nothing, and
    its gradient is zero.

    Example::

        >>> losses = torch.tensor([1.0, float("nan"), 2.0])
        >>> sum_of_finite(losses, ~torch.isfinite(losses))
        tensor(3.)
    """
    return torch.where(bad, 0.0, losses).sum()


@dataclass
class HealthReadback:
    """What the rows did since the last read-back: optimizer steps taken, and divergences (reason, step)."""

    steps: dict[int, int] = field(default_factory=dict)
    diverged: dict[int, tuple[str, int]] = field(default_factory=dict)


class RowHealth:
    """Per-row step counts and divergences of a fused group, accumulated on the device.

    Args:
        check_every: read back at least every this many optimizer steps (after the ramp 1, 2, 4, ...); None:
            1 on the CPU, 32 on other devices.
    """

    def __init__(self, check_every: int | None = None) -> None:
        if check_every is not None and check_every < 1:
            raise ValueError(
                f"divergence_check_every must be a positive number of optimizer steps or None, got {check_every}; "
                "pass e.g. 32 (read the group's health back every 32 steps) or None (the device's default)."
            )
        self.check_every = check_every
        self._ids: list[int] = []
        self._loss_bad: Tensor | None = None  # rows whose loss was non-finite since the last optimizer step
        self._bad: Tensor | None = None  # rows skipped since the last read-back (they stay skipped until then)
        # since the last read-back, per optimizer step: the [B] rows skipped, and those skipped with the loss as
        # reason (counted at the read-back: one op there instead of two each step)
        self._skipped: list[Tensor] = []
        self._loss_skipped: list[Tensor] = []
        self._steps: list[int] = []  # the optimizer steps absorbed since the last read-back
        self._absorbed = 0  # optimizer steps seen since the fit started (drives the read-back schedule)
        self._stepped = False  # an optimizer step ran in the open batch (not only gradient accumulation)
        self._read_due = False  # the schedule asks for a read-back at the open batch's end

    @property
    def pending(self) -> bool:
        """Whether anything was recorded since the last read-back."""
        return bool(self._steps) or self._loss_bad is not None

    def _rows_for(self, trial_ids: list[int]) -> None:
        if trial_ids == self._ids:
            return
        if self.pending:
            raise RuntimeError(
                f"RowHealth: the rows changed from {self._ids} to {list(trial_ids)} with unread records; read them "
                "back (RowHealth.read) before changing the group's slots."
            )
        self._ids = list(trial_ids)

    def record_losses(self, trial_ids: Sequence[int], losses: Tensor) -> Tensor:
        """A step's ``[B]`` losses (gradient accumulation: every micro-batch's); returns which are not finite."""
        self._rows_for(trial_ids if isinstance(trial_ids, list) else list(trial_ids))
        losses = losses.detach()
        bad = not_finite(losses)
        self._loss_bad = bad if self._loss_bad is None else self._loss_bad | bad
        return bad

    def record_finite_losses(self, trial_ids: Sequence[int]) -> None:
        """A step whose ``[B]`` losses were all read as finite (nothing to record but the rows)."""
        self._rows_for(trial_ids if isinstance(trial_ids, list) else list(trial_ids))

    def rows_to_skip(self, trial_ids: list[int]) -> Tensor | None:
        """The rows the optimizer must not step: a non-finite loss now, or a divergence not yet read back."""
        if trial_ids != self._ids:
            return None  # nothing recorded for these rows
        if self._bad is None or self._loss_bad is None:
            return self._loss_bad if self._bad is None else self._bad
        return self._loss_bad | self._bad

    def reads_each_step(self, device: torch.device) -> bool:
        """Whether a step may read its masks back for free: on the CPU, read back every step as the group is.

        On the CPU an op is done when it returns, and ``check_every`` 1 is its default. Never on an accelerator,
        whose steady steps stay free of host syncs.
        """
        return device.type == "cpu" and self._every(device) == 1

    def _every(self, device: torch.device) -> int:
        return self.check_every if self.check_every is not None else 1 if device.type == "cpu" else 32

    def absorb(self, report: StepReport | None, step: int) -> bool:
        """Record an optimizer step (``step``: its number, e.g. the Trainer's global step after it).

        A row once skipped is skipped at every later step until the read-back (:meth:`rows_to_skip` says so), so
        counting its skipped steps tells when it went bad, and its steps skipped for the loss tell why: at its first
        bad step only its gradients can have been the reason. ``report`` None: the step produced no gradients
        (nothing was updated, nothing to record).

        Returns whether to read back now: the schedule says so, or the report is on the host already (the batch's
        end does: :meth:`end_batch`).
        """
        if not isinstance(report, StepReport):
            return False
        self._rows_for(list(report.trial_ids))
        self._loss_bad = None
        self._absorbed += 1
        self._bad = skipped = report.skipped
        self._skipped.append(skipped)
        self._loss_skipped.append(report.skipped_loss)
        self._steps.append(step)
        due = report.on_host or self._due(skipped.device)
        self._stepped, self._read_due = True, self._read_due or due
        return due

    def mark_stepped(self) -> None:
        """An optimizer step ran in the open batch (manual optimization: Lightning logs step values after each)."""
        self._stepped = True

    def end_batch(self, last: bool) -> tuple[bool, bool]:
        """A training batch ended (``last``: the epoch's last); returns (an optimizer step ran in it, read back now).

        The epoch's last batch is always read back: before validation, so that decisions taken after it see every
        divergence, and so that the epoch is credited to each trial that trained through it.
        """
        stepped, read = self._stepped, self._read_due or last
        self._stepped = self._read_due = False
        return stepped, read

    def _due(self, device: torch.device) -> bool:
        every = self._every(device)
        n = self._absorbed
        if n <= every:
            return n & (n - 1) == 0 or n == every  # 1, 2, 4, 8, ... then every
        return n % every == 0

    def peek(self) -> HealthReadback:
        """What :meth:`read` would return, without forgetting it (for a checkpoint: one sync)."""
        n = len(self._steps)
        if not n:
            return HealthReadback()
        masks = torch.stack(self._skipped + self._loss_skipped)  # [2n, B]: one step's masks are its counts
        counts = masks if n == 1 else masks.view(2, n, masks.shape[1]).sum(1)
        steps: dict[int, int] = {}
        diverged: dict[int, tuple[str, int]] = {}
        for tid, skips, loss_skips in zip(self._ids, *counts.tolist()):
            steps[tid] = n - skips  # stepped until it went bad
            if skips:
                diverged[tid] = (_REASONS[1 if loss_skips == skips else 2], self._steps[n - skips])
        return HealthReadback(steps=steps, diverged=diverged)

    def read(self) -> HealthReadback:
        """Everything recorded since the last read-back, then forget it (one device sync).

        The losses of micro-batches still accumulating for the next optimizer step stay recorded.
        """
        out = self.peek()
        self._bad = None
        self._skipped, self._loss_skipped, self._steps = [], [], []
        return out

    def reslot(self, trial_ids: Sequence[int]) -> None:
        """The group's rows now hold ``trial_ids`` (after :meth:`read`): carry accumulating losses over by id."""
        if self._steps:
            raise RuntimeError("RowHealth.reslot: read the records back first.")
        if self._loss_bad is not None:
            old = dict(zip(self._ids, self._loss_bad.unbind(0)))
            false = torch.zeros((), dtype=torch.bool, device=self._loss_bad.device)
            self._loss_bad = torch.stack([old.get(tid, false) for tid in trial_ids]) if trial_ids else None
        self._ids = list(trial_ids)

    def reset(self) -> None:
        """Forget every record (a checkpoint is being loaded)."""
        self._ids, self._loss_bad, self._bad = [], None, None
        self._skipped, self._loss_skipped, self._steps = [], [], []
        self._stepped = self._read_due = False
