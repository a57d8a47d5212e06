"""The Python state of trial modules: which attributes are the user's, and putting them back after a probe.

A trial's steps and hooks change Python state: a counter (``self.calls += 1``), Lightning 2's outputs list
(``self.training_step_outputs.append(loss)``), a flag. Trained alone, each trial's own module holds what its own
code did; fused, every such change must end up in each trial's module the same way
(:mod:`~lightning_hydro.backends.step_state` does that for the vectorised backends).

*Tracked* are the instance attributes of a trial's LightningModule and of every submodule whose class is not
torch's own (``nn.Linear``'s settings are compared when a backend is built, see
:mod:`~lightning_hydro.backends.trial_attributes`), not a torchmetrics metric (its calls are replayed per
trial, see :mod:`~lightning_hydro.backends.deferred_metrics`) and not one of our fused operators; minus the
attributes torch and Lightning keep there themselves (``_parameters``, ``_trainer``, ``_hparams``...).

Probes run the user's step to measure or check it (``backend="auto"``'s timing runs, the first-batch
verification): :class:`PythonState` saves the tracked attributes, and the contents of the lists, dicts, sets
and deques they hold, so that a probe leaves no trace.

Example::

    >>> from torch import nn
    >>> class Counting(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.calls, self.outputs = 0, []
    >>> trial = Counting()
    >>> with preserved_python_state([trial]):
    ...     trial.calls += 1
    ...     trial.outputs.append("probe")
    ...     trial.new_flag = True
    >>> trial.calls, trial.outputs, hasattr(trial, "new_flag")
    (0, [], False)
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "CONTAINER_TYPES",
    "FRAMEWORK_KEYS",
    "PythonState",
    "copy_template",
    "preserved_python_state",
    "state_generation",
    "tracked_modules",
    "trial_code_ran",
    "user_keys",
]

# Instance attributes that torch's nn.Module and Lightning's LightningModule keep on a module (checked against a
# fresh LightningModule in tests/backends/test_python_state.py), and the ones our adapters put there for a call.
FRAMEWORK_KEYS = frozenset(
    {
        # nn.Module
        "_backward_hooks",
        "_backward_pre_hooks",
        "_buffers",
        "_forward_hooks",
        "_forward_hooks_always_called",
        "_forward_hooks_with_kwargs",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_is_full_backward_hook",
        "_load_state_dict_post_hooks",
        "_load_state_dict_pre_hooks",
        "_modules",
        "_non_persistent_buffers_set",
        "_parameters",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "training",
        # LightningModule
        "_automatic_optimization",
        "_compiler_ctx",
        "_current_fx_name",
        "_device",
        "_device_mesh",
        "_dtype",
        "_example_input_array",
        "_fabric",
        "_fabric_optimizers",
        "_log_hyperparams",
        "_metric_attributes",
        "_param_requires_grad_state",
        "_strict_loading",
        "_trainer",
        "allow_zero_length_dataloader_with_multiple_devices",
        "prepare_data_per_node",
        "_hparams",  # save_hyperparameters(): compared, and read per trial, as hparams (trial_attributes.py)
        "_hparams_initial",
        "_hparams_name",
        # ours: capture_logs' recorder, the width scaling's per-trial optimizer hooks
        "log",
        "configure_optimizers",
        "on_save_checkpoint",
    }
)

# Containers whose contents are followed (saved, restored, and changed per trial by step_state.py).
CONTAINER_TYPES = (list, dict, set, collections.deque)

# Classes whose instances keep no user state: torch's modules, torchmetrics' metrics, our fused operators.
_LIBRARY_PREFIXES = ("torch.", "torchmetrics.", "lightning_hydro.backends.")

_generation = [0]


def trial_code_ran() -> None:
    """Say that the trials' own code ran outside a vectorised call (a hook, a loop step): their state may differ."""
    _generation[0] += 1


def state_generation() -> int:
    """A number that changes whenever :func:`trial_code_ran` is called (cached comparisons check it)."""
    return _generation[0]


def _is_library(module: nn.Module) -> bool:
    name = type(module).__module__
    return name == "torch" or name.startswith(_LIBRARY_PREFIXES)


def tracked_modules(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(path, submodule)`` of the module itself and of each submodule whose attributes are user state."""
    return [(path, sub) for path, sub in module.named_modules() if not path or not _is_library(sub)]


def user_keys(module: nn.Module) -> list[str]:
    """The module's own instance attributes that are user state (not torch's or Lightning's bookkeeping)."""
    return [key for key in vars(module) if key not in FRAMEWORK_KEYS and not key.startswith("__")]


class PythonState:
    """The tracked attributes of some modules, and the contents of the containers they hold, to put back.

    Tensors held directly by an attribute are cloned and copied back if changed in place; tensors inside
    containers, and other objects, are kept by reference (their own insides are not saved).

    Args:
        modules: the trial modules.
    """

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self._attributes: list[tuple[nn.Module, dict[str, Any]]] = []
        self._contents: list[tuple[Any, list[Any]]] = []
        self._tensors: list[tuple[Tensor, int, Tensor]] = []
        seen: set[int] = set()
        for module in modules:
            for _, sub in tracked_modules(module):
                values = {key: vars(sub)[key] for key in user_keys(sub)}
                self._attributes.append((sub, values))
                for value in values.values():
                    if isinstance(value, Tensor) and id(value) not in seen:
                        seen.add(id(value))
                        with torch.no_grad():
                            self._tensors.append((value, value._version, value.detach().clone()))
                    else:
                        self._save_contents(value, seen)

    def _save_contents(self, value: Any, seen: set[int]) -> None:
        if isinstance(value, tuple):
            for item in value:
                self._save_contents(item, seen)
            return
        if not isinstance(value, CONTAINER_TYPES) or id(value) in seen:
            return
        seen.add(id(value))
        contents = list(value.items()) if isinstance(value, dict) else list(value)
        self._contents.append((value, contents))
        for item in value.values() if isinstance(value, dict) else contents:
            self._save_contents(item, seen)

    def restore(self) -> None:
        """Put every saved attribute and container content back (added attributes are removed)."""
        for container, contents in self._contents:
            container.clear()
            if isinstance(container, (dict, set)):
                container.update(contents)
            else:
                container.extend(contents)
        for sub, values in self._attributes:
            attributes = vars(sub)
            for key in user_keys(sub):
                if key not in values:
                    del attributes[key]
            attributes.update(values)
        with torch.no_grad():
            for tensor, version, saved in self._tensors:
                if tensor._version != version:
                    tensor.copy_(saved)
        trial_code_ran()  # cached comparisons of the trials' values hold no more


def copy_template(module: nn.Module) -> nn.Module:
    """A deep copy of a trial module to run as a template, without copying what its Python state holds.

    The template's state is put in place for each call (:mod:`~lightning_hydro.backends.step_state`); copying a
    trial's outputs list would copy the tensors in it, which cannot be deep-copied while they carry a graph.
    Its containers start empty and its tensors are shared.
    """
    memo: dict[int, Any] = {}
    for _, sub in tracked_modules(module):
        for key in user_keys(sub):
            _share(vars(sub)[key], memo)
    return copy.deepcopy(module, memo)


def _share(value: Any, memo: dict[int, Any]) -> None:
    if isinstance(value, Tensor):
        memo[id(value)] = value
    elif isinstance(value, collections.deque):
        memo[id(value)] = collections.deque(maxlen=value.maxlen)
    elif isinstance(value, CONTAINER_TYPES):
        memo[id(value)] = type(value)()
    elif isinstance(value, tuple):
        for item in value:
            _share(item, memo)


@contextmanager
def preserved_python_state(modules: Sequence[nn.Module]) -> Iterator[PythonState]:
    """Run a block (a probe of the trials' steps), then put the trials' Python state back as it was."""
    state = PythonState(modules)
    try:
        yield state
    finally:
        state.restore()
