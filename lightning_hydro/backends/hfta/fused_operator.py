"""What every fused operator shares: per-trial settings, the trial count check, and the vmap-only Function.

A fused operator is the user's own module with its class swapped for a fused subclass (parameters,
buffers, hooks and names untouched). Its forward calls a :class:`TrialFunction` whose ``vmap`` staticmethod
is the fused rule: under ``torch.func.vmap`` torch hands the rule the physical tensors (trial dim
included) and their batch dims, and ordinary autograd records whatever the rule computes, so the outer
``loss.sum().backward()`` needs no hand-written backward.

Under ``torch.compile`` dynamo traces an autograd Function's ``forward``, not its ``vmap`` rule, so a fused
operator there runs the torch module's own forward, which vmap's batching rules map over the trials (what the vmap
backend runs, and inductor then fuses): where every trial's per-trial settings equal the module's own
(:attr:`FusedModule.settings_agree`). Where they differ (trials with different dropout rates, say) it raises as
outside vmap, and the compiled step falls back to eager.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

import torch
from torch import Tensor, nn

from lightning_hydro.backends.hfta.errors import FusedCallError
from lightning_hydro.backends.hfta.per_trial import PerTrial, values_equal

InDims = tuple[int | None, ...]
FusedModuleT = TypeVar("FusedModuleT", bound="FusedModule")


class VmapInfo(Protocol):
    """What torch tells a ``vmap`` staticmethod about the running vmap."""

    @property
    def batch_size(self) -> int:
        """Size of the vmapped dimension: the number of trials."""

    @property
    def randomness(self) -> str:
        """``"error"``, ``"same"`` or ``"different"``, as passed to ``torch.func.vmap``."""


class TrialAnchor:
    """Finds, at call time, a tensor that is batched over trials: a parameter of the converted model.

    A parameter-free operator (dropout, pooling, an activation) whose input is the shared data batch
    would otherwise see no batched tensor, and torch would skip its fused rule. Under
    ``functional_call`` the named attribute resolves to the stacked tensor.

    Args:
        root: the converted model.
        name: dotted name of one of its parameters or buffers.

    Example::

        >>> model = nn.Sequential(nn.Linear(2, 3))
        >>> TrialAnchor(model, "0.weight")().shape
        torch.Size([3, 2])
    """

    def __init__(self, root: nn.Module, name: str) -> None:
        self.root = root
        self.name = name

    def __call__(self) -> Tensor:
        """The named tensor as the model holds it now (the stacked one under ``functional_call``)."""
        value: Any = self.root
        for part in self.name.split("."):
            value = getattr(value, part)
        return value


class FusedModule(nn.Module):
    """Mixin of every fused operator; always listed before the torch module class it fuses.

    Subclasses set :attr:`fused_from` (the torch class) and :attr:`per_trial_attributes` (the Python
    attributes that may differ between trials and are honoured per trial).

    Example::

        >>> from lightning_hydro.backends.hfta.linear import FusedLinear
        >>> trials = [nn.Linear(2, 3) for _ in range(4)]
        >>> FusedLinear.fuse(nn.Linear(2, 3), trials, path="fc").num_trials
        4
    """

    fused_from: ClassVar[type[nn.Module]] = nn.Module
    per_trial_attributes: ClassVar[tuple[str, ...]] = ()
    construction_only_attributes: ClassVar[tuple[str, ...]] = ()
    """Attributes only read when the module was built (e.g. PReLU ``init``): free to differ."""
    trial_settings: dict[str, PerTrial[Any]]
    num_trials: int
    module_path: str
    trial_anchor: TrialAnchor | None
    #: every trial's per-trial settings equal the module's own: the torch module's forward serves each trial
    settings_agree: bool = False
    #: False: the class's ``forward`` runs under ``torch.compile`` as it is (it calls the torch forward itself)
    torch_forward_when_compiling: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Each fused ``forward`` runs the torch module's own under ``torch.compile`` (see the module's docstring)."""
        super().__init_subclass__(**kwargs)
        forward = cls.__dict__.get("forward")
        if forward is not None and cls.__dict__.get("torch_forward_when_compiling", True):
            cls.forward = _torch_forward_when_compiling(forward)

    @classmethod
    def fuse(
        cls: type[FusedModuleT],
        module: nn.Module,
        trials: Sequence[nn.Module],
        *,
        path: str = "",
        anchor: TrialAnchor | None = None,
    ) -> FusedModuleT:
        """Turns ``module`` (in place) into this fused operator for ``trials``.

        Args:
            module: the template's module, an instance of exactly :attr:`fused_from`.
            trials: the same module of each trial, in slot order.
            path: the module's dotted path, used in error messages.
            anchor: where to find a trial-batched tensor (see :class:`TrialAnchor`).

        Raises:
            TypeError: ``module`` is not exactly a :attr:`fused_from`.
        """
        if type(module) is not cls.fused_from:
            raise TypeError(
                f"{cls.__name__}.fuse expects a {cls.fused_from.__name__}, got {type(module).__name__}; "
                "subclasses may change forward, so they are not fused"
            )
        module.__class__ = cls
        fused: FusedModuleT = module  # type: ignore[assignment]  # the class swap above
        fused.module_path = path
        fused.trial_anchor = anchor
        fused.bind_trials(trials)
        return fused

    def bind_trials(self, trials: Sequence[nn.Module]) -> None:
        """Gathers :attr:`per_trial_attributes` from ``trials`` (slot order)."""
        self.trial_settings = {name: PerTrial.gather(trials, name) for name in self.per_trial_attributes}
        self.num_trials = len(trials)
        self._settings_changed()

    def select_trials(self, slots: Sequence[int]) -> None:
        """Keeps the settings of the trials in ``slots`` only, in that order (after trials are removed)."""
        self.trial_settings = {name: values.select(slots) for name, values in self.trial_settings.items()}
        self.num_trials = len(slots)
        self._settings_changed()

    def _settings_changed(self) -> None:
        self.settings_agree = all(
            values.is_uniform and values_equal(values.first, getattr(self, name))
            for name, values in self.trial_settings.items()
        )

    def setting(self, name: str) -> PerTrial[Any]:
        """The per-trial values of attribute ``name``."""
        return self.trial_settings[name]

    def describe(self) -> str:
        """How error messages name this operator, e.g. ``FusedLinear at 'encoder.fc'``."""
        return f"{type(self).__name__} at '{self.module_path}'"

    def check_trial_count(self, batch_size: int) -> None:
        """Raises unless vmap runs over exactly the trials this operator was converted for."""
        if batch_size != self.num_trials:
            raise FusedCallError(
                f"{self.describe()} was converted for {self.num_trials} trials but vmap runs over "
                f"{batch_size}; after removing trials call select_trials(model, slots), after adding "
                "trials convert the template again with convert_to_fused(template, trials)"
            )

    def anchor(self) -> Tensor | None:
        """A tensor batched over trials under vmap, or ``None`` when the model has no tensors at all.

        This module's first parameter or buffer if it has one, else the model-wide :class:`TrialAnchor`.
        """
        for tensor in (*self._parameters.values(), *self._buffers.values()):
            if tensor is not None:
                return tensor
        return None if self.trial_anchor is None else self.trial_anchor()


class TrialFunction(torch.autograd.Function):
    """Base of the fused rules: an autograd Function that only runs under ``torch.func.vmap``.

    Subclasses define the ``vmap`` staticmethod. Its ordinary torch ops are recorded by autograd, so
    neither ``forward`` nor ``backward`` below is used by a fused model; they exist to fail loudly when a
    fused module is called without vmap.
    """

    generate_vmap_rule = False

    @staticmethod
    def forward(*args: Any) -> Any:
        """Refuses to run: fused operators need the stacked trial state that vmap provides."""
        names = [module.describe() for module in args if isinstance(module, FusedModule)]
        raise FusedCallError(
            f"{', '.join(names) or 'a fused operator'} ran outside torch.func.vmap (or with no input batched "
            "over trials); run the converted model as functional_call(model, stacked_state, args) inside "
            "torch.func.vmap over the trial dim, or use the original trial modules"
        )

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        """Nothing to save: backward goes through the ops recorded by the vmap rule."""

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        """Never reached, since :meth:`forward` refuses to run."""
        raise FusedCallError("fused operators are differentiated through their vmap rule only")


def logical_shape(tensor: Tensor, in_dim: int | None) -> torch.Size:
    """The shape one trial sees: the physical shape without the trial dim.

    Example::

        >>> logical_shape(torch.zeros(5, 3, 2), 1), logical_shape(torch.zeros(5, 3), None)
        (torch.Size([5, 2]), torch.Size([5, 3]))
    """
    if in_dim is None:
        return tensor.shape
    return tensor.shape[:in_dim] + tensor.shape[in_dim + 1 :]


def trials_first(tensor: Tensor, in_dim: int | None, batch_size: int) -> Tensor:
    """``tensor`` with its trial dim first; an unbatched tensor is expanded (a view, no copy).

    Example::

        >>> trials_first(torch.zeros(5, 3, 2), 1, 3).shape, trials_first(torch.zeros(5), None, 3).shape
        (torch.Size([3, 5, 2]), torch.Size([3, 5]))
    """
    return trials_at(tensor, in_dim, 0, batch_size)


def trials_first_or_shared(tensor: Tensor, in_dim: int | None) -> Tensor:
    """``tensor`` as ``[B, ...]`` with its trial dim first, or ``[1, ...]`` when it is shared by all trials.

    Example::

        >>> trials_first_or_shared(torch.zeros(3, 2), None).shape, trials_first_or_shared(torch.zeros(3, 2), 1).shape
        (torch.Size([1, 3, 2]), torch.Size([2, 3]))
    """
    return tensor.unsqueeze(0) if in_dim is None else tensor.movedim(in_dim, 0)


def trials_at(tensor: Tensor, in_dim: int | None, position: int, batch_size: int) -> Tensor:
    """``tensor`` with its trial dim at ``position``; an unbatched tensor is expanded (a view)."""
    if in_dim is not None:
        return tensor.movedim(in_dim, position)
    expanded = tensor.unsqueeze(position)
    shape = list(expanded.shape)
    shape[position] = batch_size
    return expanded.expand(shape)


def channel_affine(
    normalised: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    weight_dim: int | None,
    bias_dim: int | None,
    trials: int,
) -> Tensor:
    """``normalised * weight + bias`` on ``[N, B, C, *]`` with per-trial ``[B, C]`` weight and bias (norm layers)."""
    shape = (1, trials, normalised.shape[2], *([1] * (normalised.dim() - 3)))
    if weight is not None:
        normalised = normalised * trials_first(weight, weight_dim, trials).reshape(shape)
    if bias is not None:
        normalised = normalised + trials_first(bias, bias_dim, trials).reshape(shape)
    return normalised


def random_uniform(randomness: str, shape: Sequence[int], like: Tensor) -> Tensor:
    """Uniform [0, 1) draws for a fused random op, honouring vmap's ``randomness`` mode.

    ``shape`` starts with the trial dim. With ``"same"`` every trial gets the same draws (a trial dim
    of size 1, broadcast); with ``"error"`` this raises as vmap itself would.
    """
    if randomness == "error":
        raise FusedCallError(
            "vmap: called random operation while in randomness error mode; pass randomness='different' "
            "(independent per trial) or 'same' to torch.func.vmap"
        )
    if randomness == "same":
        shape = (1, *shape[1:])
    return torch.rand(tuple(shape), dtype=like.dtype, device=like.device)


def drop_per_trial(
    samples: Tensor, keep_probability: Tensor, mask_shape: Sequence[int], randomness: str, like: Tensor
) -> Tensor:
    """Dropout with each trial's own keep probability (``[B, 1, ...]``), the mask drawn as ``mask_shape``.

    The draws take ``like``'s dtype and device; kept elements are scaled by ``1 / keep_probability`` (a
    trial with ``p = 1`` drops everything).
    """
    keep = random_uniform(randomness, mask_shape, like) < keep_probability
    scale = torch.where(keep_probability > 0, 1.0 / keep_probability, torch.zeros_like(keep_probability))
    return samples * (keep * scale)


def _torch_forward_when_compiling(fused_forward: Callable[..., Any]) -> Callable[..., Any]:
    """``fused_forward``, but under ``torch.compile`` the torch module's own where the trials' settings agree."""

    @functools.wraps(fused_forward)
    def forward(self: FusedModule, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling() and self.settings_agree:
            return type(self).fused_from.forward(self, *args, **kwargs)
        return fused_forward(self, *args, **kwargs)

    return forward
