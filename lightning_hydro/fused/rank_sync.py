"""``RankSync``: a fused group trained by several processes (Lightning's DDP strategies) stays one group.

DDP runs the fused module in every process, each on its share of every batch, and averages the gradients. So
every rank must hold the same trials in the same rows, skip the same rows and decide alike:

- what the trials log with ``sync_dist=True`` is reduced across the ranks (:attr:`TrialMetrics.reduce
  <lightning_hydro.fused.logging.metrics.TrialMetrics.reduce>`, set by :meth:`RankSync.setup`);
- a row whose loss is not finite on any rank is skipped on every rank (:func:`rows_bad_on_any_rank`): one
  element-wise ``all_reduce`` per step, no wait for the device;
- ``backend="auto"`` takes rank zero's choice (timings differ between processes: :meth:`RankSync.chooser`);
- the rows change on every rank in the same hook (early-stopping decisions are taken on rank zero and
  broadcast). DDP's wrapper keeps the parameters it was built with, so after a slot change it is rebuilt
  before the next training step (:meth:`RankSync.rewrap`), through the strategy's own ``configure_ddp``.
  Rebuilding (one broadcast of the parameters per slot change, which also checks that every rank holds the
  same shapes) is chosen over keeping ended rows as masked rows while DDP is on: the group still shrinks, so
  a stopped trial costs nothing per step, and DDP runs through the same slot code that one process runs;
- under ``ddp_spawn`` (and ``ddp_fork``) the fit runs in processes other than the one that built the module,
  and Lightning hands only the module's state dict back to it. The group's own state (which trial is in which
  row, every trial's record, the ended trials' weights) travels in that state dict (:meth:`RankSync.hand_back`)
  and is restored before the weights load (:meth:`RankSync.take_back`), so ``fused.results`` and
  ``fused.unfuse`` in the main process describe the trained group.

Only DDP spreads a group over processes: a sharded strategy (FSDP, DeepSpeed) splits the stacked tensors
themselves, and is refused when the fit starts.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from torch import Tensor

from lightning_hydro.fused.logging.metrics import ReduceFx, Reducer
from lightning_hydro.fused.step.backend_policy import Chooser

__all__ = ["HAND_BACK_KEY", "RankSync", "rows_bad_on_any_rank"]

HAND_BACK_KEY = "_lightning_hydro_group"  # the group's state in the state dict a spawned worker hands back


def rows_bad_on_any_rank(losses: Tensor) -> Tensor:
    """``losses`` with every row that is not finite on some rank made NaN on every rank (one ``all_reduce``)."""
    bad = (~torch.isfinite(losses.detach())).to(losses.dtype)
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # no barrier: on a GPU the host does not wait for it
    return torch.where(bad > 0, torch.full_like(losses, float("nan")), losses)


class RankSync:
    """Keeps the ranks of a fused group in step (see the module docstring); inert in a one-process run."""

    def __init__(self) -> None:
        self.world_size = 1
        self.rows_changed = False
        self.handing_back = False
        self._built_in = os.getpid()  # a spawned worker runs a copy of the module built here

    def setup(self, trainer: L.Trainer) -> Reducer | None:
        """Check the strategy; returns the reducer of ``sync_dist`` metrics (None for one process).

        Raises:
            ValueError: for a strategy other than DDP that runs several processes.
        """
        self.world_size = trainer.world_size
        if self.world_size <= 1:
            return None
        strategy = trainer.strategy
        if not isinstance(strategy, DDPStrategy | SingleDeviceStrategy):
            raise ValueError(
                f"FusedLightningModule: a fused group runs on one device or under DDP (strategy='ddp', "
                f"'ddp_spawn', ...), got {type(strategy).__name__} over {self.world_size} processes, which would "
                "split the stacked [B, ...] tensors between them. Fix: Trainer(strategy='ddp'), or several groups "
                "in parallel, one per device (hydra.sweeper.devices_per_group=1)."
            )

        def reduce(values: Tensor, op: ReduceFx) -> Tensor:
            device = values.device
            return strategy.reduce(values.to(strategy.root_device), reduce_op=op).to(device)

        return reduce

    def mark_rows_changed(self) -> None:
        """The group's rows changed (a trial stopped or added): DDP's wrapper is rebuilt before the next step."""
        self.rows_changed = True

    @property
    def distributed(self) -> bool:
        """Whether several processes train the group."""
        return self.world_size > 1

    def losses(self, losses: Tensor) -> Tensor:
        """The step's ``[B]`` losses, with the rows that are not finite on any rank not finite here too."""
        return rows_bad_on_any_rank(losses) if self.distributed else losses

    def chooser(self, choose: Chooser, trainer: L.Trainer) -> Chooser:
        """``choose`` on rank zero; the other ranks build the backend it chose, untimed."""
        if not self.distributed:
            return choose

        def chosen_on_rank_zero(group: Any, candidates: Any, run_step: Any, **kwargs: Any) -> Any:
            choice, failure = None, None
            if trainer.is_global_zero:
                try:
                    choice = choose(group, candidates, run_step, **kwargs)
                except Exception as err:  # raised below, once the other ranks know
                    failure = err
            sent = None if choice is None else choice.backend.name
            name, failed = trainer.strategy.broadcast((sent, None if failure is None else repr(failure)), src=0)
            if failure is not None:
                raise failure
            if failed is not None:
                raise RuntimeError(f"FusedLightningModule: backend='auto' failed on rank 0 ({failed}).")
            if choice is not None:
                return choice
            return choose(group, [c for c in candidates if c[0] == name], run_step, timed=False)

        return chosen_on_rank_zero

    def rewrap(self, trainer: L.Trainer) -> None:
        """Rebuild DDP's wrapper around the module after its rows changed (every rank does, at the same step)."""
        if not self.rows_changed:
            return
        self.rows_changed = False
        strategy = trainer.strategy
        if not self.distributed or not isinstance(strategy, DDPStrategy):
            return
        if not isinstance(strategy.model, torch.nn.parallel.DistributedDataParallel):
            return  # not wrapped yet: Lightning wraps the current rows when the fit starts
        strategy.model = strategy.lightning_module
        strategy.configure_ddp()

    def fit_ended(self) -> None:
        """At the end of a fit: in a worker that ``ddp_spawn`` started, hand the group's state back with the weights."""
        self.handing_back = os.getpid() != self._built_in

    def hand_back(self, state_dict: dict[str, Any], prefix: str, group_state: Callable[[], dict[str, Any]]) -> None:
        """Add the group's state to the state dict a spawned worker returns to the main process."""
        if not self.handing_back:
            return
        buffer = io.BytesIO()
        torch.save(group_state(), buffer)
        # as bytes, so that the main process's (weights-only) load of the state dict accepts it
        state_dict[prefix + HAND_BACK_KEY] = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)

    @staticmethod
    def take_back(state_dict: dict[str, Any], prefix: str) -> dict[str, Any] | None:
        """The group's state that a spawned worker handed back in ``state_dict`` (removed from it), if any."""
        packed = state_dict.pop(prefix + HAND_BACK_KEY, None)
        if packed is None:
            return None
        # written by this run's own worker process (hand_back above): trusted, so a full load
        return torch.load(io.BytesIO(packed.numpy().tobytes()), weights_only=False)
