"""Train/eval modes of the trial modules around evaluation.

Lightning records the train/eval mode of the LightningModule's submodules before evaluation and restores it
after; the trial modules of a fused group are not its submodules, so their modes are recorded and restored
here, and a trial added during evaluation is given the mode the others return to. A trial whose own
``on_validation_model_eval`` / ``on_validation_model_train`` (or test/predict) hook sets its modes keeps what its
hook sets, as alone: Lightning's default (``eval()`` before, the recorded modes after) is not applied to it.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

__all__ = ["TrialModes"]


class TrialModes:
    """The modes recorded before an evaluation, restored after it."""

    def __init__(self) -> None:
        self._saved: list[tuple[nn.Module, bool]] = []

    def capture(self, owner: nn.Module, trials: Iterable[nn.Module]) -> None:
        """Record the mode of ``owner`` and every trial module (and their submodules)."""
        modules = [*owner.modules(), *(m for trial in trials for m in trial.modules())]
        self._saved = [(m, m.training) for m in modules]

    def set_newcomer(self, owner: nn.Module, module: nn.Module) -> None:
        """A trial added during evaluation trains after it, like the others: record that mode for the restore."""
        before_evaluation = next((mode for m, mode in self._saved if m is owner), None)
        if before_evaluation is None:
            module.train(owner.training)
            return
        module.train(before_evaluation)
        self._saved += [(m, m.training) for m in module.modules()]
        module.eval()

    def put_back(self, trial: nn.Module) -> None:
        """Put the recorded modes of ``trial`` and its submodules back (its own hook sets them, not the default)."""
        inside = {id(m) for m in trial.modules()}
        for module, mode in self._saved:
            if id(module) in inside:
                module.training = mode

    def restore(self, *, keep: Iterable[nn.Module] = ()) -> None:
        """Put every recorded mode back, but in ``keep``'s trials (and their submodules): their own hooks set them."""
        kept = {id(m) for trial in keep for m in trial.modules()}
        for module, mode in self._saved:
            if id(module) not in kept:
                module.training = mode
        self._saved = []
