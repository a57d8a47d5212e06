"""Python state that differs between trials and that the fused code reads: what vmap would run wrongly.

The ``vmap`` backend (and ``hfta``, outside the modules its fused operators take over) runs ONE template
module's Python code for every trial; only parameters and buffers are per trial. A plain attribute that
differs between trials (``self.nan_step = 20`` in one trial, ``None`` in the others) would run with the
template's value in every trial: silently wrong results. Values that differ but that only code run per
trial reads are fine: ``hparams.lr`` read by ``configure_optimizers`` is consumed by each trial's own
optimizer, which is THE common case of a sweep.

So the group is scanned when a fused backend is built: every plain attribute (numbers, strings, tuples,
lists, dicts of those, tensors that are not parameters or buffers) of every submodule, and the root's
``hparams``, are compared across trials, and each differing one is checked against the names that the code
run under the backend reads. That code is the root's ``training_step``, ``validation_step``, ``test_step``,
``predict_step`` and ``forward``, each submodule's ``forward``, and, followed from them, the methods of the
same class and the functions outside torch and Lightning that they name (the names come from the code
objects: ``co_names``, and string constants next to ``getattr`` or ``hparams``). A name read anywhere in
that code counts, whichever object it is read from: the scan errs towards refusing.

What it cannot see (state in non-module objects, values reached through containers it does not compare)
is left to the fused module's first-batch comparison of fused and unfused outputs (:mod:`..fused.verify`).

Example::

    >>> from torch import nn
    >>> trials = [nn.Sequential(nn.Linear(2, 2), nn.Dropout(p)) for p in (0.1, 0.5)]
    >>> [str(a) for a in unfusible_attributes(trials, ids=[0, 1])]
    ['1.p (trial 0: 0.1, trial 1: 0.5)']
"""

from __future__ import annotations

import dis
import inspect
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from torch import Tensor, nn

from lightning_hydro._deprecation import Renamed, renamed_names
from lightning_hydro.backends.config_values import config_leaves, plain_mapping
from lightning_hydro.backends.deferred_metrics import metric_paths
from lightning_hydro.backends.errors import package_dir
from lightning_hydro.backends.hfta import per_trial
from lightning_hydro.backends.python_state import CONTAINER_TYPES, tracked_modules

__all__ = [
    "DifferingAttribute",
    "differing_modes",
    "hook_reads",
    "hook_writes",
    "scan_attributes",
    "settings_fingerprint",
    "state_writes",
    "submodule_at",
    "uncompared_reads",
    "unfusible_attributes",
    "unfusible_error_text",
]

# the methods the fused backends run on the root module (the trial's LightningModule)
STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step", "forward")
_IGNORED = {"training", "prepare_data_per_node", "allow_zero_length_dataloader_with_multiple_devices"}
_SCALARS = (bool, int, float, complex, str, bytes, type(None))
# code here is not the user's: a LightningModule's own methods (log, ...) read nothing of the user's values
_FRAMEWORK_DIRS = tuple(directory for directory in (package_dir("torch"), package_dir("lightning")) if directory)
_MISSING = "<missing>"


@dataclass(frozen=True)
class DifferingAttribute:
    """A plain Python value that differs between the trials of a group.

    Attributes:
        path: the submodule's dotted path (``""`` for the root module).
        name: the attribute name, or ``"hparams.<key>"`` for a hyperparameter of the root.
        values: the value of each trial, in the order of ``ids``.
        ids: the trial ids.
        read: whether code run under a fused backend reads it.
        readers: whose code reads it: ``""`` for the root's steps, else the path of a submodule whose ``forward``
            (the module's own, or an enclosing one's) names it.
    """

    path: str
    name: str
    values: tuple[Any, ...]
    ids: tuple[int, ...]
    read: bool
    readers: tuple[str, ...] = ()

    @property
    def qualified_name(self) -> str:
        """``path.name`` (or just ``name`` on the root)."""
        return f"{self.path}.{self.name}" if self.path else self.name

    def __str__(self) -> str:
        shown = ", ".join(f"trial {tid}: {_short(value)}" for tid, value in zip(self.ids, self.values))
        return f"{self.qualified_name} ({shown})"


def _short(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"tensor{list(value.shape)} sum {float(value.detach().double().sum()):.6g}"
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _comparable(value: Any) -> bool:
    if isinstance(value, (*_SCALARS, Tensor)):
        return True
    if isinstance(value, (tuple, list)):
        return all(_comparable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, _SCALARS) and _comparable(v) for k, v in value.items())
    return False


def _plain_state(module: nn.Module) -> dict[tuple[str, str], Any]:
    """``(path, name)`` -> value of every comparable public attribute of every submodule, and the hparams.

    A torchmetrics metric's state is each trial's own by design (its calls are replayed per trial): left out.
    """
    found: dict[tuple[str, str], Any] = {}
    metrics = tuple(f"{path}." for path in metric_paths(module).values())
    for path, sub in module.named_modules():
        if f"{path}.".startswith(metrics):
            continue
        for key, value in vars(sub).items():
            if not key.startswith("_") and key not in _IGNORED:
                found.update(((path, name), v) for name, v in _plain_values(key, value).items())
    hparams = plain_mapping(getattr(module, "hparams", None))  # Lightning's AttributeDict, or a DictConfig
    for key, value in (hparams or {}).items():
        if isinstance(key, str):
            found.update((("", f"hparams.{name}"), v) for name, v in _plain_values(key, value).items())
    return found


def _plain_values(name: str, value: Any) -> dict[str, Any]:
    """``{name: value}`` for a plain value; the leaves of a config object (dataclass, DictConfig, namespace) by name."""
    return {name: value} if _comparable(value) else config_leaves(name, value, _comparable)


def _is_config_leaf(name: str) -> bool:
    """Whether a scanned name is a leaf inside a config object (``cfg.loss.gamma``, ``hparams.cfg.lr``)."""
    return "." in name.removeprefix("hparams.")


def scan_attributes(modules: Sequence[nn.Module], *, ids: Sequence[int]) -> list[DifferingAttribute]:
    """Every plain attribute (and hparam) whose value is not the same in all ``modules``, read or not.

    Each submodule's own attributes are compared by
    :func:`~lightning_hydro.backends.hfta.per_trial.differing_attributes`, the one comparison of the fused
    backends; of those that differ, the plain values are kept (numbers, strings, tensors that are not parameters
    or buffers, containers of them; a value of another kind is ``<missing>``), and each is checked against what
    the fused code reads.
    """
    states = [_plain_state(module) for module in modules]
    keys: dict[tuple[str, str], None] = {}
    for state in states:
        keys.update(dict.fromkeys(state))
    paths = dict.fromkeys(path for path, name in keys if not name.startswith("hparams."))
    differing = [
        (path, name)
        for path in paths
        for name in per_trial.differing_attributes([submodule_at(module, path) for module in modules])
        if name not in _IGNORED
    ]
    # hparams and the leaves of config objects (dotted names) are compared by value, not as a module's attributes
    differing += [key for key in keys if key[1].startswith("hparams.") or _is_config_leaf(key[1])]
    reads = _ReadNames(modules[0])
    found = []
    for path, name in differing:
        values = tuple(state.get((path, name), _MISSING) for state in states)
        if all(per_trial.values_equal(values[0], value) for value in values[1:]):
            continue  # the same plain value in every trial (or a plain value in none)
        readers = reads.readers(path, name)
        found.append(DifferingAttribute(path, name, values, tuple(ids), bool(readers), readers))
    return found


def submodule_at(module: nn.Module, path: str) -> object:
    """The submodule at ``path``, or an object without attributes where the trial has none."""
    try:
        return module.get_submodule(path)
    except AttributeError:
        return SimpleNamespace()


def unfusible_attributes(
    modules: Sequence[nn.Module],
    *,
    ids: Sequence[int],
    handled: Callable[[str], bool] = lambda path: False,
    settings_only: bool = False,
) -> list[DifferingAttribute]:
    """The differing attributes that fused code reads, except those run per trial.

    A submodule's setting is run per trial where ``handled(path)`` (hfta's fused operators honour theirs)
    and no code outside such a module reads it: a forward that hands ``self.attn_dropout.p`` to
    ``F.scaled_dot_product_attention`` itself (Hugging Face GPT-2, timm ViT) computes with the template's value.
    Lists, dicts, sets and deques of the trial's own classes are not refused here: the vectorised backends
    give each trial its own (:mod:`~lightning_hydro.backends.step_state`) and refuse a read that differs.

    Args:
        modules: the trial modules, in slot order.
        ids: their trial ids (for the messages).
        handled: True for a submodule path whose differing settings the backend honours per trial (hfta's
            fused operators do for theirs).
        settings_only: leave out the attributes of the trial's own classes (the backends refuse a differing
            one where the step uses it): what is left are torch's modules' settings and the hparams.
    """
    tracked = {path for path, _ in tracked_modules(modules[0])}

    def is_per_trial(attribute: DifferingAttribute) -> bool:
        leaf = _is_config_leaf(attribute.name)  # inside a config object: no step state of its own
        if not leaf and attribute.path in tracked and all(isinstance(v, CONTAINER_TYPES) for v in attribute.values):
            return True
        if settings_only and attribute.path in tracked and not attribute.name.startswith("hparams."):
            return True  # the user's own attributes: a value that differs is refused where a step uses it
        return handled(attribute.path) and all(reader and handled(reader) for reader in attribute.readers)

    return [a for a in scan_attributes(modules, ids=ids) if a.read and not is_per_trial(a)]


def settings_fingerprint(modules: Sequence[nn.Module]) -> list[dict[tuple[str, str], Any]]:
    """Each trial's plain settings of the modules whose state is not the user's (torch's: dropout ``p``...).

    Numbers, strings and containers of them (a metric's state tensors are not settings); two fingerprints are
    equal when no such setting changed in between.
    """
    tracked = {path for path, _ in tracked_modules(modules[0])}
    return [
        {
            key: value
            for key, value in _plain_state(module).items()
            if (key[0] not in tracked or key[1].startswith("hparams."))
            and not _is_config_leaf(key[1])  # read back by name: a config object's leaves are not
            and not _holds_tensor(value)
        }
        for module in modules
    ]


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(_holds_tensor(v) for v in value)
    return isinstance(value, dict) and any(_holds_tensor(v) for v in value.values())


def uncompared_reads(modules: Sequence[nn.Module]) -> list[str]:
    """Attributes the fused code reads that are objects this scan cannot compare, and not one shared object.

    They are the suspects when fused and own outputs disagree although no compared value differs.
    """
    reads = _ReadNames(modules[0])
    found = []
    for path, sub in modules[0].named_modules():
        for key, value in vars(sub).items():
            if key.startswith("_") or _comparable(value) or isinstance(value, nn.Module) or callable(value):
                continue
            others = [_attribute(m, path, key) for m in modules[1:]]
            if all(other is value for other in others) or not reads.reads(path, key):
                continue
            found.append(f"{f'{path}.{key}' if path else key} ({type(value).__name__})")
    return found


def _attribute(module: nn.Module, path: str, key: str) -> Any:
    try:
        return vars(module.get_submodule(path)).get(key, _MISSING)
    except AttributeError:
        return _MISSING


def unfusible_error_text(backend: str, module_name: str, attributes: Sequence[DifferingAttribute]) -> str:
    """The message of the refusal: which values differ, why that is wrong under ``backend``, what to do."""
    listed = "; ".join(_with_readers(a) for a in attributes[:10])
    more = f" (and {len(attributes) - 10} more)" if len(attributes) > 10 else ""
    handed_on = any(reader != a.path for a in attributes for reader in a.readers if a.path)
    note = (
        f" {backend} runs a converted module's own settings per trial, but code that reads such a setting and "
        "hands it on itself (F.dropout(x, self.drop.p), F.scaled_dot_product_attention(..., dropout_p=...)) "
        "runs once, with the first trial's value."
        if backend == "hfta" and handed_on
        else ""
    )
    return (
        f"backend={backend!r} cannot fuse these {module_name} trials: the code it runs for all trials at once "
        f"reads Python values that differ between trials: {listed}{more}. {backend} runs one template "
        f"module's code for every trial, so each trial would silently compute with the first trial's value.{note} "
        "Use backend='loop' (backend='auto' does so by itself), or make each such value a tensor registered "
        "with register_buffer (buffers are per trial)."
    )


def _with_readers(attribute: DifferingAttribute) -> str:
    outside = [reader for reader in attribute.readers if reader != attribute.path]
    if not outside:
        return str(attribute)
    named = ", ".join("the steps of the LightningModule" if not r else f"the forward of {r!r}" for r in outside)
    return f"{attribute}, read by {named}"


# -- what the fused code reads ---------------------------------------------------------------------------------


def _function(obj: Any) -> types.FunctionType | None:
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        obj = obj.fget
    try:
        obj = inspect.unwrap(obj) if callable(obj) else obj
    except ValueError:  # a cycle of __wrapped__
        return None
    return obj if isinstance(obj, types.FunctionType) else None


def _framework(function: types.FunctionType) -> bool:
    return function.__code__.co_filename.startswith(_FRAMEWORK_DIRS)


def _nested(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested(const)


_READS: dict[tuple[type, tuple[str, ...], bool], frozenset[str]] = {}


def _names_read(cls: type, entries: tuple[str, ...], framework_methods: bool) -> frozenset[str]:
    """Cached :func:`_scan_names` (code does not change while the process runs)."""
    key = (cls, entries, framework_methods)
    if key not in _READS:
        _READS[key] = _scan_names(cls, entries, framework_methods)
    return _READS[key]


def _followed_code(cls: type, entries: tuple[str, ...], framework_methods: bool) -> Iterator[types.CodeType]:
    """The code of ``entries`` of ``cls`` and of what they call (nested functions included).

    Methods of ``cls`` named in the code are followed (those defined in torch or Lightning only if
    ``framework_methods``: a LightningModule's own ``log`` reads nothing of the user's), in code that calls
    ``super()`` also the user's base classes' methods of those names (``super().training_step(batch, batch_idx)``
    runs the parent's); global functions are followed unless they belong to torch or Lightning.
    """
    seen: set[types.CodeType] = set()
    todo = [f for e in entries if (f := _function(inspect.getattr_static(cls, e, None))) is not None]
    while todo:
        function = todo.pop()
        if function.__code__ in seen:
            continue
        seen.add(function.__code__)
        for code in _nested(function.__code__):
            yield code
            bases = cls.__mro__[1:] if "super" in code.co_names else ()
            for name in code.co_names:
                method = _function(inspect.getattr_static(cls, name, None))
                if method is not None and (framework_methods or not _framework(method)):
                    todo.append(method)
                for base in bases:  # the user's own base classes' code that super() reaches
                    inherited = _function(base.__dict__.get(name))
                    if inherited is not None and not _framework(inherited):
                        todo.append(inherited)
                called = _function(function.__globals__.get(name))
                if called is not None and not _framework(called):
                    todo.append(called)


def _scan_names(cls: type, entries: tuple[str, ...], framework_methods: bool) -> frozenset[str]:
    """Names read by ``entries`` of ``cls`` and what they call; ``"hparams."`` + key for hyperparameter reads."""
    names: set[str] = set()
    for code in _followed_code(cls, entries, framework_methods):
        strings = {c for c in code.co_consts if isinstance(c, str)}
        names.update(code.co_names)
        if "getattr" in code.co_names:
            names.update(strings)
        if "hparams" in code.co_names:
            names.update(f"hparams.{key}" for key in {*code.co_names, *strings})
    return frozenset(names)


# methods that change a list, dict, set or deque in place
_MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "popleft", "popitem", "appendleft", "extendleft", "clear", "setdefault"}
)
_STORES: dict[type, tuple[str, ...]] = {}
_HOOK_STORES: dict[tuple[type, str], tuple[str, ...]] = {}


def state_writes(template: nn.Module) -> tuple[str, ...]:
    """What the code the fused backends run may change in Python state: ``"calls"``, ``"outputs.append"``.

    Read off the code (attribute stores and deletions, ``setattr``, calls of methods that change a container), in
    the root's steps and the forwards of the user's own submodule classes; it errs towards finding writes.
    """
    if type(template) not in _STORES:
        codes = [_followed_code(type(template), STEP_METHODS, False)]
        codes += [_followed_code(type(m), ("forward",), True) for path, m in tracked_modules(template) if path]
        _STORES[type(template)] = _writes_in(c for iterator in codes for c in iterator)
    return _STORES[type(template)]


def hook_writes(cls: type, hook: str) -> tuple[str, ...]:
    """What a hook of ``cls`` (and the user's code it calls) may change in Python state, as :func:`state_writes`.

    Stores into containers count too (``self.seen["train"] += 1``: ``"seen[...]"``), but for those into the hook's
    own arguments (``batch["x"] = ...``): a hook that writes runs per trial, which costs runs, not results.
    """
    key = (cls, hook)
    if key not in _HOOK_STORES:
        _HOOK_STORES[key] = _writes_in(_followed_code(cls, (hook,), False), subscripts=True)
    return _HOOK_STORES[key]


def hook_reads(modules: Sequence[nn.Module], hook: str, *, ids: Sequence[int]) -> list[DifferingAttribute]:
    """The attributes (and hparams) that differ between the trials and that ``hook`` of theirs reads.

    Read off the hook's code and the user's code it calls, as for the steps: a name read anywhere counts, and a
    submodule the code names counts with every setting in it (``self.augment(x)`` runs the module's own code).
    """
    names = _names_read(type(modules[0]), (hook,), False)
    root = modules[0]
    hparams = getattr(root, "hparams", None)
    own = {*vars(root), *root._modules, *(f"hparams.{key}" for key in (hparams or {}))}
    if not names & own:  # it reads none of the trial's attributes (a normalisation by constants): nothing to compare
        return []
    return [
        attribute
        for attribute in scan_attributes(modules, ids=ids)
        if attribute.name in names or (attribute.path and attribute.path.split(".")[0] in names)
    ]


def _writes_in(codes: Iterable[types.CodeType], *, subscripts: bool = False) -> tuple[str, ...]:
    """What :func:`state_writes` describes; ``subscripts``: stores into containers too (see :func:`hook_writes`)."""
    found: dict[str, None] = {}
    for code in codes:
        instructions = list(dis.get_instructions(code))
        arguments = _untouched_arguments(code, instructions) if subscripts else frozenset()
        for index, instruction in enumerate(instructions):
            if instruction.opname in ("STORE_ATTR", "DELETE_ATTR"):
                found[str(instruction.argval)] = None
            elif subscripts and instruction.opname in ("STORE_SUBSCR", "DELETE_SUBSCR"):
                container, key = instructions[index - 2 : index] if index >= 2 else (None, None)
                if not (_loads(container, arguments) and key is not None and key.opname in _SIMPLE_LOADS):
                    owner = container.argval if container is not None and container.opname == "LOAD_ATTR" else ""
                    found[f"{owner}[...]"] = None
            elif instruction.argval in _MUTATORS and index and instruction.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                owner = instructions[index - 1].argval
                found[f"{owner if isinstance(owner, str) else '[...]'}.{instruction.argval}"] = None
        if "setattr" in code.co_names or "delattr" in code.co_names:
            found["setattr(...)"] = None
    return tuple(found)


_SIMPLE_LOADS = frozenset({"LOAD_CONST", "LOAD_FAST", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME"})


def _untouched_arguments(code: types.CodeType, instructions: list[dis.Instruction]) -> frozenset[str]:
    """The arguments of ``code`` but the first (``self``) that it never rebinds: the batch, not the module's state."""
    count = code.co_argcount + code.co_kwonlyargcount
    rebound = {i.argval for i in instructions if i.opname in ("STORE_FAST", "DELETE_FAST")}
    return frozenset(name for name in code.co_varnames[1:count] if name not in rebound)


def _loads(instruction: dis.Instruction | None, names: frozenset[str]) -> bool:
    return instruction is not None and instruction.opname == "LOAD_FAST" and instruction.argval in names


class _ReadNames:
    """Names read by the fused code of a template module, per submodule path (its own and its ancestors')."""

    def __init__(self, template: nn.Module) -> None:
        self.template = template
        self.root = _names_read(type(template), STEP_METHODS, False)

    def _of(self, path: str) -> frozenset[str]:
        try:
            module = self.template.get_submodule(path)
        except AttributeError:
            return frozenset()
        return _names_read(type(module), ("forward",), True)

    def reads(self, path: str, name: str) -> bool:
        return bool(self.readers(path, name))

    def readers(self, path: str, name: str) -> tuple[str, ...]:
        """``""`` if the root's steps name ``name``, and each of ``path`` and its ancestors whose forward does.

        A config object's leaf (``cfg.loss.gamma``, ``hparams.cfg.gamma``) is read where the code names the object
        and the leaf's own name (the last part that is not a list index).
        """
        head, dot, rest = name.removeprefix("hparams.").partition(".")
        if dot:
            leaf = next((part for part in reversed(rest.split(".")) if not part.isdigit()), head)
            hparams = name.startswith("hparams.")
            owners = self.readers(path, f"hparams.{head}" if hparams else head)
            wanted = f"hparams.{leaf}" if hparams else leaf
            return tuple(owner for owner in owners if wanted in (self.root if not owner else self._of(owner)))
        if name.startswith("hparams."):
            return ("",) if name in self.root else ()
        found = [""] if name in self.root else []
        parts = path.split(".") if path else []
        for depth in range(1, len(parts) + 1):
            prefix = ".".join(parts[:depth])
            if name in self._of(prefix):
                found.append(prefix)
        return tuple(found)


# Old name, kept for one release: one function is called differing_attributes, a module's own attributes.
__getattr__ = renamed_names(
    __name__,
    {
        "differing_attributes": Renamed(
            f"{__name__}:scan_attributes",
            "is renamed scan_attributes (lightning_hydro.backends.hfta.per_trial.differing_attributes compares "
            "one module's own attributes); import lightning_hydro.backends.trial_attributes.scan_attributes",
        )
    },
)


def differing_modes(modules: Sequence[nn.Module]) -> list[str]:
    """The outermost submodule paths (``""``: the root) whose train/eval mode is not the same in every trial.

    A trial's own code may set its modes (Lightning's ``self.freeze()`` also calls ``eval()``, a hook may keep
    BatchNorm training during validation), where vmap and hfta run one template's modes for every row.

    Example::

        >>> trials = [nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)) for _ in range(2)]
        >>> _ = trials[1][1].eval()
        >>> differing_modes(trials)
        ['1']
    """
    if not modules:  # every trial has ended (an evaluation after the fit): nothing runs fused
        return []
    first = {path: sub.training for path, sub in modules[0].named_modules()}
    paths = {
        path
        for module in modules[1:]
        for path, sub in module.named_modules()
        if first.get(path, sub.training) != sub.training
    }
    return [path for path in sorted(paths) if not any(_inside(path, other) for other in paths)]


def _inside(path: str, other: str) -> bool:
    """Whether submodule ``path`` lies inside submodule ``other`` (every path lies inside the root's, "")."""
    return path != other and (not other or path.startswith(f"{other}."))
