"""How Lightning sees the trials of a fused group, and how each trial sees Lightning.

- :mod:`.trainer_view` and :mod:`.strategy_view`: each trial's ``self.trainer``, answering for that trial (its
  metrics under unfused names, ``self.optimizers()``, ``self.lr_schedulers()``, ``self.manual_backward``);
- :mod:`.hooks`: the trials' own epoch- and fit-level hooks, run per trial;
- :mod:`.callbacks`: Lightning's callbacks configured for an unfused run made per trial, or refused; one adapter
  per file, each running a copy per trial through :mod:`.callback_view`;
- :mod:`.group_checkpoint`: the group's state in a Lightning checkpoint, and a trial's own checkpoint recognised;
- :mod:`.trial_checkpoint_hooks`: the trials' own ``on_save_checkpoint`` / ``on_load_checkpoint`` in it;
- :mod:`.batch_hooks`, :mod:`.batch_transfer`, :mod:`.trial_optimizer_steps`: the trials' own batch-level hooks, their
  batch-transfer hooks, and their ``optimizer_step`` around the group's step.

Nothing here is public API (users meet it through ``FusedLightningModule`` and the Trainer): each name stays in its
module.
"""

__all__: list[str] = []
