"""The names Lightning gives a logged value, which a fused trial's values take too (before ``"/trial_{id}"``).

``self.log("loss", v, on_step=True, on_epoch=True)`` is one value to the user and three names to Lightning: the
step value goes to the loggers as ``"loss_step"``, the epoch value as ``"loss_epoch"``, and
``trainer.callback_metrics`` holds ``"loss"`` as well (the step value during the epoch, the epoch value after
it). A value logged from a validation or test step of one of several dataloaders carries the loader's suffix,
after the ``_step``/``_epoch`` part: ``"loss_epoch/dataloader_idx_1"`` (none with ``add_dataloader_idx=False``).

A fused group publishes each trial's value under the same name with the trial's suffix last:
``"loss_epoch/dataloader_idx_1/trial_3"``, so a callback configured with the unfused name (``monitor=
"loss_epoch/dataloader_idx_1"``) finds it in each trial's view of the Trainer, as for the trial trained alone.

Example::

    >>> names = lightning_names("loss", forked=True, dataloader_idx=1)
    >>> names.plain, names.step, names.epoch
    ('loss/dataloader_idx_1', 'loss_step/dataloader_idx_1', 'loss_epoch/dataloader_idx_1')
    >>> lightning_names("acc", forked=False)
    LightningNames(plain='acc', step='acc', epoch='acc')
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LightningNames", "lightning_names"]


@dataclass(frozen=True)
class LightningNames:
    """The names of one logged value (Lightning's ``_ResultCollection._forked_name``).

    Attributes:
        plain: the name in ``trainer.callback_metrics``, for step and epoch values alike.
        step: the step value's name for the loggers and ``logged_metrics`` (``plain`` unless forked).
        epoch: the epoch value's name for the loggers and ``logged_metrics``, also in ``callback_metrics``.
    """

    plain: str
    step: str
    epoch: str

    @property
    def forked(self) -> bool:
        """Whether the value has step and epoch names of its own (``on_step=True, on_epoch=True``)."""
        return self.step != self.plain


def lightning_names(name: str, *, forked: bool, dataloader_idx: int | None = None) -> LightningNames:
    """The names Lightning gives ``name``: ``forked`` when logged on step and epoch, with the loader's suffix if any.

    ``dataloader_idx`` is the evaluation dataloader the value came from, None for one loader, training, epoch-end
    hooks, or ``add_dataloader_idx=False`` (Lightning adds the suffix only with several loaders).
    """
    suffix = "" if dataloader_idx is None else f"/dataloader_idx_{dataloader_idx}"
    if not forked:
        return LightningNames(name + suffix, name + suffix, name + suffix)
    return LightningNames(name + suffix, f"{name}_step{suffix}", f"{name}_epoch{suffix}")
