"""What the trials of a fused group log, kept per trial and handed to Lightning under ``"{name}/trial_{id}"``.

- :mod:`.metrics`: ``TrialMetrics``, each step's logged values as ``[B]`` tensors, reduced per trial and epoch;
- :mod:`.publisher`: ``TrialPublisher``, what the loggers, the progress bar, ``self.log`` and the trials' records
  are told.

Nothing here is public API (users meet it through ``FusedLightningModule``): each name stays in its module.
"""

__all__: list[str] = []
