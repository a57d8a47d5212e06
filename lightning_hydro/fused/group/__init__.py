"""The trials' state in a fused group: who holds each slot, what is known of every trial, how trials are built.

- :mod:`.slots`: ``TrialSlots``, the rows of the stacked state and stop / add as one operation each;
- :mod:`.book`: ``TrialBook``, every trial's record (status, budget, steps, metrics, history), pure Python;
- :mod:`.specs`: trials built from hyperparameter configs, and rebuilt from a checkpoint;
- :mod:`.width_padding`: which optimizer path trials of different widths take.

Nothing here knows Lightning's Trainer: each module is testable on its own. Nothing here is public API (users meet
it through ``FusedLightningModule``): each name stays in its module.
"""

__all__: list[str] = []
