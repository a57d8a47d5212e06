"""The trials' own ``on_save_checkpoint`` / ``on_load_checkpoint`` in a group checkpoint.

Alone, Lightning calls a module's ``on_save_checkpoint(checkpoint)`` with the checkpoint it writes and its
``on_load_checkpoint(checkpoint)`` with the one it restores: modules keep Python state there (a step counter, a list
of epoch losses). In a group checkpoint each trial's hook gets a dict of its own, holding what of Lightning's
checkpoint belongs to the trial (:data:`TRIAL_KEYS`, and the trial's ``save_hyperparameters``); the keys its
``on_save_checkpoint`` adds are kept by trial id, for the running trials and those that left the group, and on
resume (or ``load_group_checkpoint``) its ``on_load_checkpoint`` gets that dict back, additions included.

The weights, optimizer and scheduler states, loops and callbacks of a group checkpoint are the group's (stacked,
every trial's): a trial's dict has none of them, and a hook that reads one is told so (:func:`save_trial_entries`).
A trial that overrides neither hook costs nothing.

Example::

    >>> import lightning as L
    >>> class Counting(L.LightningModule):
    ...     steps = 8
    ...     def on_save_checkpoint(self, checkpoint):
    ...         checkpoint["steps"] = (self.steps, checkpoint["epoch"])
    ...     def on_load_checkpoint(self, checkpoint):
    ...         self.steps = checkpoint["steps"][0] * 2
    >>> group = {"epoch": 1, "global_step": 8}
    >>> entries = save_trial_entries(group, [(0, Counting()), (1, L.LightningModule())])
    >>> entries
    {0: {'steps': (8, 1)}}
    >>> resumed = Counting()
    >>> load_trial_entries(group, entries, [(0, resumed)])
    >>> resumed.steps
    16
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_hydro.backends.errors import FusionError
from lightning_hydro.backends.python_state import trial_code_ran
from lightning_hydro.fused.lightning.callback_view import clone_tensors, hyperparameter_entries
from lightning_hydro.fused.lightning.hooks import call_trial_hook

__all__ = ["ENTRIES_KEY", "GROUP_KEYS", "TRIAL_KEYS", "load_trial_entries", "save_trial_entries"]

ENTRIES_KEY = "trial_checkpoints"
"""Where the group's entry of a checkpoint keeps what :func:`save_trial_entries` returned."""

TRIAL_KEYS = ("epoch", "global_step", "pytorch-lightning_version")
"""Lightning's keys of the group checkpoint that a trial's hooks find in their dict, as alone."""

GROUP_KEYS = ("state_dict", "optimizer_states", "lr_schedulers", "loops", "callbacks")
"""Lightning's keys of the group checkpoint that hold every trial's state: not in a trial's dict."""


def _trial_dict(checkpoint: Mapping[str, Any], module: L.LightningModule) -> dict[str, Any]:
    """What a trial's hooks get of the group checkpoint: :data:`TRIAL_KEYS` and its hyperparameters."""
    return {**{key: checkpoint[key] for key in TRIAL_KEYS if key in checkpoint}, **hyperparameter_entries(module)}


def _call(hook: str, trial_id: int, module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
    """``module.hook(checkpoint)``; reading one of :data:`GROUP_KEYS` there is explained."""
    try:
        call_trial_hook(hook, trial_id, module, checkpoint)
    except KeyError as err:
        if not err.args or err.args[0] not in GROUP_KEYS or err.args[0] in checkpoint:
            raise
        raise FusionError(
            f"{type(module).__name__}.{hook} of trial {trial_id} reads checkpoint[{err.args[0]!r}], which a fused "
            f"group's checkpoint holds for the whole group (every trial's {', '.join(GROUP_KEYS)}, stacked): a "
            f"trial's hooks get a dict with {', '.join(TRIAL_KEYS)}, its hyperparameters and what its "
            "on_save_checkpoint added. Read the trial's own state from the module (self.state_dict(), "
            "self.optimizers()) and keep what the hook needs under a key of its own."
        ) from err


def save_trial_entries(
    checkpoint: Mapping[str, Any], trials: Sequence[tuple[int, L.LightningModule]]
) -> dict[int, dict[str, Any]]:
    """Call each trial's own ``on_save_checkpoint``; returns what each added to its dict, by trial id.

    Args:
        checkpoint: the group checkpoint Lightning is writing (its :data:`TRIAL_KEYS` are read).
        trials: ``(trial id, module)`` of every trial the checkpoint keeps, running or ended.

    Raises:
        FusionError: a trial's hook reads one of :data:`GROUP_KEYS`.
    """
    entries: dict[int, dict[str, Any]] = {}
    for tid, module in trials:
        if not is_overridden("on_save_checkpoint", module, L.LightningModule):
            continue
        own = _trial_dict(checkpoint, module)
        lightning_keys = set(own)
        _call("on_save_checkpoint", tid, module, own)
        added = {key: clone_tensors(value) for key, value in own.items() if key not in lightning_keys}
        if added:
            entries[tid] = added
    return entries


def load_trial_entries(
    checkpoint: Mapping[str, Any],
    entries: Mapping[int, Mapping[str, Any]] | None,
    trials: Sequence[tuple[int, L.LightningModule]],
) -> None:
    """Call each trial's own ``on_load_checkpoint`` with its dict: what :func:`save_trial_entries` gave it back.

    ``entries`` is None for a group checkpoint written before the trials' hooks were called: their
    ``on_load_checkpoint`` is not called either (it would not find what it saved), with a warning.

    Raises:
        FusionError: a trial's hook reads one of :data:`GROUP_KEYS`.
    """
    loading = [(tid, m) for tid, m in trials if is_overridden("on_load_checkpoint", m, L.LightningModule)]
    if not loading:
        return
    if entries is None:
        ids = ", ".join(str(tid) for tid, _ in loading)
        rank_zero_warn(
            "FusedLightningModule: this group checkpoint was written before a group checkpoint kept what the "
            f"trials' own on_save_checkpoint adds, so the on_load_checkpoint of trials {ids} is not called: the "
            "Python state those hooks restore starts afresh (the weights, optimizers and records are restored). "
            "A checkpoint this version writes keeps it."
        )
        return
    trial_code_ran()  # the hooks change each trial's Python state its own way
    for tid, module in loading:
        _call("on_load_checkpoint", tid, module, {**_trial_dict(checkpoint, module), **entries.get(tid, {})})
