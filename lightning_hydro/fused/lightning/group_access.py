"""Code written for one LightningModule that is handed the fused group gets an answer, not silence.

A user's own callback receives ``pl_module``, and in a fused group that is the ``FusedLightningModule``, not a
trial; ``trainer.optimizers`` is the group's optimizer, whose update uses each trial's own hyperparameters. Alone,
such a callback reads and sets the trial's attributes and its optimizer's learning rate. Fused, before, setting
``pl_module.use_smoothing = True`` reached no trial, ``param_group["lr"] = ...`` reached no optimizer, and reading
``pl_module.body`` raised a bare ``AttributeError``. Here:

- :func:`trial_attribute_error`: reading an attribute the trials have and the group has not says so and how to
  reach each trial's (still an ``AttributeError``, so ``hasattr`` answers as before);
- :func:`trial_attribute_refusal`: setting one is refused (it would reach no trial);
- :class:`~lightning_hydro.optim.group_param_group.GroupParamGroup`: the group optimizer's param group refuses
  hyperparameters that would reach no trial;
- :func:`warn_group_unaware_callbacks`: at fit start, a warning names the user's callbacks whose hooks use
  ``pl_module`` (or the Trainer's model or optimizers) without the group's own API: what they read spans every
  trial (``outputs["loss"]`` is the sum of the trials' losses, a norm over ``pl_module.parameters()`` covers every
  trial's stacked tensors), and those that read the Trainer's metrics, which the group holds per trial
  (``val_loss/trial_3``), by a trial's own names (:func:`metric_reading_hooks`).

Example::

    >>> import lightning as L
    >>> class ReadsItsModule(L.Callback):
    ...     def on_train_epoch_end(self, trainer, pl_module):
    ...         pl_module.smoothing = 0.1
    >>> ReadsItsModule.__module__ = "my_project.callbacks"  # (defined here, it would count as this library's)
    >>> group_unaware_hooks(ReadsItsModule())
    ['on_train_epoch_end']
"""

from __future__ import annotations

import dis
import inspect
from collections.abc import Iterable, Sequence
from typing import Any

from lightning.fabric.utilities.data import AttributeDict
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_hydro.backends.errors import FusionError

__all__ = [
    "GROUP_API",
    "GroupHyperparameters",
    "group_unaware_hooks",
    "metric_reading_hooks",
    "trial_attribute_error",
    "trial_attribute_refusal",
    "warn_group_unaware_callbacks",
]

#: Names of the fused group's own API: a callback that names one of them knows that it acts on the group.
GROUP_API = frozenset(
    {
        "add_trial", "backend", "backend_report", "free_slots", "max_slots", "read_health", "results", "stop_trial",
        "trial_ids", "trial_module", "trial_record", "training_epoch_values", "unfuse", "logged_names",
    }
)  # fmt: skip

# the Trainer's attributes that hand a callback the model or its optimizers
_TRAINER_MODEL = frozenset({"model", "lightning_module", "optimizers", "strategy"})
# the Trainer's metrics, which a fused group holds per trial ("val_loss/trial_3")
_TRAINER_METRICS = frozenset({"callback_metrics", "logged_metrics", "progress_bar_metrics"})
_LIBRARIES = ("lightning.", "pytorch_lightning.", "lightning_hydro.", "hydra_plugins.")


def trial_attribute_error(name: str, trial_ids: Sequence[int], trial_class: str) -> AttributeError:
    """The error for reading ``name``, an attribute of each trial, on the group."""
    return AttributeError(
        f"'FusedLightningModule' object has no attribute {name!r}: it is the fused group of trials "
        f"{list(trial_ids)}, and {name!r} is an attribute of each trial's own {trial_class}. Read a trial's with "
        f"fused.trial_module(trial_id).{name}; code that should run for each trial as alone belongs in the trial "
        f"module's own hooks, which run per trial."
    )


def trial_attribute_refusal(name: str, trial_ids: Sequence[int], trial_class: str) -> FusionError:
    """The error for setting ``name``, an attribute of each trial, on the group (it would reach no trial)."""
    return FusionError(
        f"FusedLightningModule: setting {name!r} on the fused group (a callback's pl_module, trainer.model) would "
        f"reach none of its trials {list(trial_ids)}: {name!r} is an attribute of each trial's own {trial_class}. "
        f"Set it on each trial (for tid in fused.trial_ids: setattr(fused.trial_module(tid), {name!r}, value)), "
        "or in the trial module's own hooks, which run per trial as alone."
    )


class GroupHyperparameters(AttributeDict):
    """The fused group's ``hparams`` (it saves none): a trial's hyperparameter read on it says where they are."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(
                f"{key!r}: the fused group's hparams hold none of its trials' hyperparameters; each trial has its "
                f"own (fused.trial_module(tid).hparams.{key}). A callback that reads pl_module.hparams alone reads "
                "the trial's: see the warning at fit start."
            ) from None


def group_unaware_hooks(callback: Callback) -> list[str]:
    """The hooks of a user's ``callback`` that use the model or its optimizers, not knowing the fused group.

    A hook counts where its code reads its ``pl_module`` argument, or the Trainer's model, strategy or optimizers,
    and the callback's code names nothing of the group's API (:data:`GROUP_API`). Lightning's and this library's own
    callbacks are not looked at (they act per trial, or on the group knowingly).
    """
    found = []
    for name, code in _user_hooks(callback):
        module_argument = code.co_varnames[2] if code.co_argcount > 2 else None  # (self, trainer, pl_module, ...)
        if (module_argument is not None and _reads_local(code, module_argument)) or _TRAINER_MODEL & set(code.co_names):
            found.append(name)
    return found


def metric_reading_hooks(callback: Callback) -> list[str]:
    """The hooks of a user's ``callback`` that read the Trainer's metrics by a trial's own names, not the group's.

    Fused, ``trainer.callback_metrics`` (and ``logged_metrics``, ``progress_bar_metrics``) holds each trial's values
    as ``"val_loss/trial_3"``; a callback written for one module reads ``"val_loss"``, which is not there. Counted as
    :func:`group_unaware_hooks` counts: by the names the hook's code reads, unless the callback names the group's API.
    """
    return [name for name, code in _user_hooks(callback) if _TRAINER_METRICS & _names_in(code)]


def warn_group_unaware_callbacks(callbacks: Iterable[Callback]) -> None:
    """Warn, once per callback, of the user's callbacks whose hooks see the group where alone they see a trial."""
    for callback in callbacks:
        hooks = group_unaware_hooks(callback)
        if hooks:
            rank_zero_warn(
                f"FusedLightningModule: {type(callback).__name__}'s {', '.join(hooks)} use pl_module (or the "
                "Trainer's model or optimizers), which in a fused group is the group of every trial, not one trial: "
                "what they read spans every trial (outputs['loss'] is the sum of the trials' losses, a norm over "
                "pl_module.parameters() covers every trial), and attributes or hyperparameters they set on it are "
                "refused. Per-trial logic belongs in the trial module's own hooks, which run per trial as alone; "
                "code that acts on the group uses its API (fused.trial_module(id), fused.stop_trial(id, ...)).",
                category=UserWarning,
            )
        hooks = metric_reading_hooks(callback)
        if hooks:
            rank_zero_warn(
                f"FusedLightningModule: {type(callback).__name__}'s {', '.join(hooks)} read the Trainer's metrics "
                "(callback_metrics, logged_metrics or progress_bar_metrics), which in a fused group hold each "
                "trial's values under the trial's name, 'val_loss/trial_{id}': a trial's own name is not there "
                "(callback_metrics['val_loss'] raises KeyError, callback_metrics.get('val_loss') gives None). Read "
                "trainer.callback_metrics[f'val_loss/trial_{tid}'] for tid in pl_module.trial_ids, or "
                "pl_module.results.",
                category=UserWarning,
            )


def _user_hooks(callback: Callback) -> list[tuple[str, Any]]:
    """``(name, code)`` of each Callback hook the user's ``callback`` overrides; none for a group-aware callback.

    Lightning's and this library's own callbacks have none, nor has one whose code names the group's API.
    """
    cls = type(callback)
    if cls.__module__.startswith(_LIBRARIES) or cls.__module__ in ("lightning", "lightning_hydro"):
        return []
    methods = [m for _, m in inspect.getmembers(cls, inspect.isfunction) if not m.__module__.startswith(_LIBRARIES)]
    if any(GROUP_API & _names(m) for m in methods):
        return []
    hooks = []
    for name in _CALLBACK_HOOKS:
        if not is_overridden(name, callback, Callback):
            continue
        code = getattr(getattr(cls, name, None), "__code__", None)
        if code is not None:
            hooks.append((name, code))
    return hooks


def _names(function: Any) -> set[str]:
    code = getattr(function, "__code__", None)
    return set() if code is None else _names_in(code)


def _names_in(code: Any) -> set[str]:
    """The global and attribute names ``code`` reads, with those of the functions nested in it (comprehensions)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _names_in(const)
    return names


def _reads_local(code: Any, name: str) -> bool:
    """Whether ``code`` (or a function nested in it) loads the local ``name``."""
    for instruction in dis.get_instructions(code):
        if instruction.opname.startswith("LOAD_") and instruction.argval == name:
            return True
    return any(_reads_local(const, name) for const in code.co_consts if inspect.iscode(const))


_CALLBACK_HOOKS = tuple(
    name
    for name, _ in inspect.getmembers(Callback, inspect.isfunction)
    if name.startswith(("on_", "setup", "teardown"))
)
