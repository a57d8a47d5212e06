"""Stacked storage for B trial modules of one architecture, with the trial modules kept alive and bound.

Every parameter and buffer of the B trial modules lives in one tensor ``[B, ...]``. Each trial module
stays a normal module, but its parameters' ``.data`` (and its buffers) are views of its row of the stacked
tensors, so the Parameter objects - and everything attached to them, such as an optimizer's state or
mup's ``infshape`` - survive fusion. Pure torch: nothing here knows Lightning.

Example::

    >>> import torch
    >>> from torch import nn
    >>> storage = nn.Module()
    >>> trials = [nn.Linear(3, 2) for _ in range(4)]
    >>> state = StackedState(storage, trials, trial_ids=[0, 1, 2, 3])
    >>> state.params["weight"].shape
    torch.Size([4, 2, 3])
    >>> with torch.no_grad():
    ...     _ = state.params["weight"][2].fill_(1.0)
    >>> bool((trials[2].weight == 1.0).all())  # the trial module sees its row
    True
    >>> removed = state.remove([1])  # compact: three rows left, trial 2 keeps its weights
    >>> state.trial_ids, state.params["weight"].shape[0], bool((trials[2].weight == 1.0).all())
    ([0, 2, 3], 3, True)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_hydro.stacking.held_graphs import release_held_graphs
from lightning_hydro.stacking.padding import Shape, pad_to, padded_shape, true_region
from lightning_hydro.stacking.width_plan import plan_widths

__all__ = ["ArchitectureMismatchError", "StackedState", "check_same_architecture", "storage_key"]


class ArchitectureMismatchError(ValueError):
    """Trial modules that cannot be stacked: their parameters or buffers differ in name, shape or dtype.

    Attributes:
        differing_sizes: where the trials differ only in sizes (the same names, ranks and dtypes: what
            ``pad_widths=True`` fuses), each differing tensor's name and its two shapes (the refused trial's,
            then the reference's); empty for a refusal for other reasons.
    """

    def __init__(self, message: str, *, differing_sizes: Mapping[str, tuple[Shape, Shape]] | None = None) -> None:
        super().__init__(message)
        self.differing_sizes = dict(differing_sizes or {})


@dataclass(frozen=True)
class _TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool


_Signature = tuple[dict[str, _TensorSpec], dict[str, _TensorSpec]]


def _signature(module: nn.Module) -> _Signature:
    params = {name: _TensorSpec(tuple(p.shape), p.dtype, p.requires_grad) for name, p in module.named_parameters()}
    buffers = {name: _TensorSpec(tuple(b.shape), b.dtype, False) for name, b in module.named_buffers()}
    return params, buffers


def _mismatches(reference: _Signature, other: _Signature, *, sizes_may_differ: bool = False) -> list[str]:
    """What differs between two signatures; with ``sizes_may_differ`` (width padding) only names, ranks, dtypes."""

    def compared(spec: _TensorSpec) -> tuple[object, ...]:
        return (len(spec.shape) if sizes_may_differ else spec.shape, spec.dtype, spec.requires_grad)

    problems: list[str] = []
    for kind, ref, oth in (("parameter", reference[0], other[0]), ("buffer", reference[1], other[1])):
        problems += [f"{kind} {name!r} is missing" for name in sorted(ref.keys() - oth.keys())]
        problems += [f"{kind} {name!r} is extra" for name in sorted(oth.keys() - ref.keys())]
        for name in sorted(ref.keys() & oth.keys()):
            a, b = ref[name], oth[name]
            if compared(a) != compared(b):
                size = f"{len(a.shape)} dimensions of any size," if sizes_may_differ else str(list(a.shape))
                problems.append(
                    f"{kind} {name!r} is {list(b.shape)} {b.dtype} requires_grad={b.requires_grad}, expected "
                    f"{size} {a.dtype}{',' if sizes_may_differ else ''} requires_grad={a.requires_grad}"
                )
    return problems


def _paddable_mismatches(reference: _Signature, other: _Signature) -> list[str]:
    """Like :func:`_mismatches`, but sizes may differ (width padding): names, ranks and dtypes must agree."""
    return _mismatches(reference, other, sizes_may_differ=True)


def _raise_mismatch(trial_id: int, reference_id: int | str, problems: list[str]) -> None:
    shown = "; ".join(problems[:8]) + ("; ..." if len(problems) > 8 else "")
    raise ArchitectureMismatchError(
        f"Trial {trial_id} cannot be fused with {reference_id}: {shown}. Fused trials must share one "
        "architecture (same parameter and buffer names, shapes and dtypes); put trials whose shapes "
        "differ (e.g. another hidden width) into separate groups."
    )


def _differing_sizes(reference: _Signature, other: _Signature) -> dict[str, tuple[Shape, Shape]]:
    """Each tensor whose size differs, with its two shapes (``other``'s, then ``reference``'s)."""
    return {
        name: (other[kind][name].shape, reference[kind][name].shape)
        for kind in (0, 1)
        for name in sorted(reference[kind].keys() & other[kind].keys())
        if reference[kind][name].shape != other[kind][name].shape
    }


def _raise_size_mismatch(trial_id: int, reference_id: str, sizes: Mapping[str, tuple[Shape, Shape]]) -> None:
    """The refusal of trials that differ only in sizes: it names them and ``pad_widths=True``, which fuses them."""
    shown = [f"{name!r} is {list(own)} where {reference_id} has {list(ref)}" for name, (own, ref) in sizes.items()]
    listed = "; ".join(shown[:8]) + ("; ..." if len(shown) > 8 else "")
    raise ArchitectureMismatchError(
        f"Trial {trial_id} cannot be fused with {reference_id}: they differ only in sizes ({listed}). "
        "pad_widths=True fuses them: FusedLightningModule(..., pad_widths=True) zero-pads each tensor to the "
        "group's largest size and trains each trial at its own (in a sweep: hydra.sweeper.pad_widths=true, the "
        "default, with the keys that set these sizes in hydra.sweeper.non_fusible). Otherwise put trials of "
        "different sizes into separate groups.",
        differing_sizes=sizes,
    )


def _refuse(
    trial_id: int,
    reference_id: str,
    reference: _Signature,
    module: nn.Module,
    *,
    pad_widths: bool,
    reference_module: nn.Module | None,
) -> None:
    """Raise :class:`ArchitectureMismatchError` if ``module`` cannot join the group of ``reference``; else nothing.

    Trials that differ only in sizes that zero-padding computes exactly (the width plan of ``module`` and
    ``reference_module`` holds) are told that ``pad_widths=True`` fuses them; any other refusal is not.
    """
    theirs = _signature(module)
    problems = _mismatches(reference, theirs, sizes_may_differ=pad_widths)
    if not problems:
        return
    if (
        not pad_widths
        and reference_module is not None
        and not _paddable_mismatches(reference, theirs)
        and not plan_widths([reference_module, module], ids=[0, 1]).refusals
    ):
        _raise_size_mismatch(trial_id, reference_id, _differing_sizes(reference, theirs))
    _raise_mismatch(trial_id, reference_id, problems)


def check_same_architecture(modules: Sequence[nn.Module], *, ids: Sequence[int] | None = None) -> None:
    """Raise :class:`ArchitectureMismatchError` unless all modules have the same parameters and buffers.

    Same means: the same names, shapes, dtypes and ``requires_grad`` flags. The message names the first
    trial that differs from trial ``ids[0]`` and every tensor in which it differs.
    """
    ids = list(range(len(modules))) if ids is None else list(ids)
    reference = _signature(modules[0])
    for tid, module in zip(ids[1:], modules[1:]):
        _refuse(tid, f"trial {ids[0]}", reference, module, pad_widths=False, reference_module=modules[0])


def storage_key(name: str) -> str:
    """The attribute name under which the stacked tensor of parameter/buffer ``name`` is registered."""
    return name.replace(".", "__")


def _set_buffer(module: nn.Module, name: str, value: Tensor) -> None:
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    owner._buffers[leaf] = value


class StackedState:
    """The stacked parameters and buffers of a group of trial modules, and the binding of each trial to its row.

    Rows are *slots*: row ``i`` belongs to ``trial_ids[i]``. Removing trials compacts the rows (later steps
    cost less); appending a trial adds a row. The stacked Parameter objects registered on ``storage`` never
    change identity, only their ``.data``, so optimizers and Lightning keep valid references.

    With ``pad_widths=True`` the trials' tensors may differ in size (hidden widths): each is zero-padded to
    the group's elementwise largest shape (:mod:`.padding`) and each trial is bound to the leading corner of
    its row (:meth:`region`), so that it keeps its own width. The padded shape follows the live trials: it
    shrinks when the widest leaves and grows when a wider one joins.

    Args:
        storage: module on which the stacked parameters and buffers are registered (so that ``.to()``,
            ``state_dict()`` and Lightning see them).
        modules: the trial modules, one per slot, all of one architecture.
        trial_ids: one id per module.
        pad_widths: allow tensors of different sizes (same names, ranks, dtypes), zero-padded.
    """

    def __init__(
        self,
        storage: nn.Module,
        modules: Sequence[nn.Module],
        trial_ids: Sequence[int],
        *,
        pad_widths: bool = False,
    ) -> None:
        if not modules:
            raise ValueError("StackedState needs at least one trial module, got none.")
        self.pad_widths = pad_widths
        reference = _signature(modules[0])
        for tid, module in zip(list(trial_ids)[1:], modules[1:]):
            _refuse(tid, f"trial {trial_ids[0]}", reference, module, pad_widths=pad_widths, reference_module=modules[0])
        self._reference = reference
        # each row's own shape of every parameter and buffer (all equal to the stacked shape unless padded)
        self.true_shapes: list[dict[str, Shape]] = [_shapes(m) for m in modules]
        self.storage = storage
        self.modules: list[nn.Module] = list(modules)
        self.trial_ids: list[int] = list(trial_ids)
        self.params: dict[str, nn.Parameter] = {}
        # the rows whose trial has frozen its parameter, by name, where other rows train (see follow_requires_grad)
        self.frozen: dict[str, tuple[int, ...]] = {}
        self._trial_params: dict[str, list[nn.Parameter]] = {}  # each trial's parameter by name, in row order (bind)
        self._followed_flags: dict[str, bool] = {}  # each stacked parameter's requires_grad as last followed
        self.buffers: dict[str, Tensor] = {}
        self._persistent: dict[str, bool] = {}
        first = modules[0]
        non_persistent = _non_persistent_buffer_names(first)
        for name, param in first.named_parameters():
            shape = padded_shape([shapes[name] for shapes in self.true_shapes])
            rows = torch.stack([pad_to(m.get_parameter(name).detach(), shape) for m in modules])
            stacked = nn.Parameter(rows, requires_grad=param.requires_grad)
            storage.register_parameter(storage_key(name), stacked)
            self.params[name] = stacked
        for name, _ in first.named_buffers():
            shape = padded_shape([shapes[name] for shapes in self.true_shapes])
            rows = torch.stack([pad_to(m.get_buffer(name), shape) for m in modules])
            storage.register_buffer(storage_key(name), rows, persistent=name not in non_persistent)
            self.buffers[name] = rows
            self._persistent[name] = name not in non_persistent
        self.bind()

    @property
    def size(self) -> int:
        """Number of occupied slots (rows)."""
        return len(self.trial_ids)

    @property
    def device(self) -> torch.device:
        """The device the stacked tensors live on."""
        return next(iter(self.params.values())).device

    @property
    def is_padded(self) -> bool:
        """Whether some row's tensor is smaller than the stacked shape (trials of different widths)."""
        return any(self.region(name, row) is not None for row in range(self.size) for name in self.true_shapes[row])

    def region(self, name: str, row: int) -> tuple[slice, ...] | None:
        """The index of row ``row``'s own tensor ``name`` inside its stacked row; None where it fills the row."""
        if not self.pad_widths:
            return None
        stacked = self.params[name] if name in self.params else self.buffers[name]
        true = self.true_shapes[row][name]
        return None if true == tuple(stacked.shape[1:]) else true_region(true)

    def trial_view(self, name: str, row: int, stacked_row: Tensor) -> Tensor:
        """``stacked_row`` (row ``row`` of a stacked tensor, or of its gradient) cut to the trial's own shape."""
        region = self.region(name, row)
        return stacked_row if region is None else stacked_row[region]

    def row_of(self, trial_id: int) -> int:
        """The row (slot index) of a live trial."""
        try:
            return self.trial_ids.index(trial_id)
        except ValueError:
            raise KeyError(f"Trial {trial_id} is not in this group; live trials: {self.trial_ids}.") from None

    def refresh_buffers(self) -> None:
        """Re-read the stacked buffers from ``storage`` (after ``.to()`` or ``load_state_dict`` replaced them)."""
        for name in self.buffers:
            self.buffers[name] = self.storage.get_buffer(storage_key(name))

    def bind(self) -> None:
        """Point every trial's parameters and buffers at its row of the stacked tensors."""
        self.refresh_buffers()
        self._trial_params = {name: [module.get_parameter(name) for module in self.modules] for name in self.params}
        for name, stacked in self.params.items():
            for row, param in enumerate(self._trial_params[name]):
                param.data = self.trial_view(name, row, stacked.data[row])
        self.bind_buffers()
        self._followed_flags = {}  # the trials' flags are the truth at binding (the stacked tensors may be new)
        self.follow_requires_grad()  # (the rows may have changed)

    def saved_buffers(self) -> dict[str, Tensor]:
        """Copies of the stacked buffers, by name, for :meth:`restore_buffers` (a check's runs leave no trace)."""
        return {name: buffer.clone() for name, buffer in self.buffers.items()}

    def restore_buffers(self, saved: Mapping[str, Tensor]) -> None:
        """Put the stacked buffers back to ``saved`` (:meth:`saved_buffers`) and bind the trials to them again.

        A buffer whose value did not change is left alone (not even written): a backward pass may still need it.
        """
        with torch.no_grad():
            for name, value in saved.items():
                buffer = self.buffers[name]
                if not torch.equal(buffer, value):
                    buffer.copy_(value)
        self.bind_buffers()

    def bind_buffers(self) -> None:
        """Point every trial's buffers at its row of the stacked buffers again.

        A trial's own code run on its module directly (not through the backends) that *reassigns* a buffer
        (``self.count = self.count + 1``) replaces the module's view of its row with a tensor of its own.
        """
        for row, module in enumerate(self.modules):
            for name, stacked_buffer in self.buffers.items():
                _set_buffer(module, name, self.trial_view(name, row, stacked_buffer[row]))

    def replace_buffers(self, values: Mapping[str, Tensor]) -> None:
        """Make each given ``[B, ...]`` tensor the stacked buffer of its name, and bind the trials to its rows.

        For buffers a step reassigned: a new tensor, as the step made alone, leaves the old one intact for an
        autograd graph that saved it (a copy into it would fail that graph's backward).
        """
        for name, value in values.items():
            old = self.buffers[name]
            if value.shape != old.shape or value.dtype != old.dtype or value.device != old.device:
                raise ValueError(
                    f"StackedState.replace_buffers: {name!r} must stay {tuple(old.shape)}, {old.dtype} on "
                    f"{old.device}; got {tuple(value.shape)}, {value.dtype} on {value.device}."
                )
            _set_buffer(self.storage, storage_key(name), value)
            self.buffers[name] = value
            for row, module in enumerate(self.modules):
                _set_buffer(module, name, self.trial_view(name, row, value[row]))

    def adopt_reassigned_buffers(self, rows: Iterable[int] | None = None) -> None:
        """Store each buffer a trial's own code reassigned on its module as the trial's row, and bind it again.

        For code run on the trial modules directly (their hooks): a buffer changed in place is in the row already,
        one reassigned (``self.ema = 0.9 * self.ema + ...``) is a tensor of the module's own, which the next fused
        step would not see.

        Raises:
            ValueError: the new tensor's shape or dtype differs from the row's.
        """
        if not self.buffers:
            return
        found: dict[str, dict[int, Tensor]] = {}
        for row in range(self.size) if rows is None else rows:
            module = self.modules[row]
            for name, stacked_buffer in self.buffers.items():
                current = module.get_buffer(name)
                if current.untyped_storage().data_ptr() == stacked_buffer.untyped_storage().data_ptr():
                    continue  # still a view of its row
                own = self.trial_view(name, row, stacked_buffer[row])
                if current.shape != own.shape or current.dtype != own.dtype:
                    raise ValueError(
                        f"trial {self.trial_ids[row]}'s code reassigned its buffer {name!r} with shape "
                        f"{tuple(current.shape)} and dtype {current.dtype}, where it had {tuple(own.shape)} and "
                        f"{own.dtype}: the trials' buffers are stacked, one row per trial, and a row keeps its "
                        "shape and dtype. Keep them, or keep the value as a plain attribute."
                    )
                found.setdefault(name, {})[row] = current
        if found:
            self.replace_buffers({name: self.with_rows(name, values) for name, values in found.items()})

    def with_rows(self, name: str, values: Mapping[int, Tensor]) -> Tensor:
        """A copy of the stacked buffer ``name`` holding the given rows' new values (each at its trial's width)."""
        stacked = self.buffers[name].detach().clone()
        with torch.no_grad():
            for row, value in values.items():
                self.trial_view(name, row, stacked[row]).copy_(value)
        return stacked

    def follow_requires_grad(self) -> None:
        """Take into the group each trial parameter's ``requires_grad``, which its own code may toggle (unfreezing).

        A stacked parameter requires grad where any row's trial parameter does; the rows whose trial has frozen it
        while others train it are kept in :attr:`frozen`: the backends leave their gradients out
        (:meth:`drop_frozen_grads`) and their trials see none (:meth:`distribute_grads`), so their optimizers pass
        over them, as torch's pass over a frozen parameter alone.
        """
        frozen: dict[str, tuple[int, ...]] = {}
        followed = self.__dict__.setdefault("_followed_flags", {})  # (a group pickled before it existed has none)
        for name, stacked in self.params.items():  # (every step: the trials' parameters as bind found them)
            trial_params = self._trial_params[name]
            if name in followed and stacked.requires_grad != followed[name]:
                # set on the stacked tensor itself (a callback's pl_module.freeze(), as alone it freezes the trial's
                # parameters): every trial's parameter takes it, or the trials' flags would undo it here
                for param in trial_params:
                    param.requires_grad_(stacked.requires_grad)
            flags = [param.requires_grad for param in trial_params]
            trains = any(flags)
            if stacked.requires_grad != trains:
                stacked.requires_grad_(trains)
            followed[name] = trains
            if trains and not all(flags):
                frozen[name] = tuple(row for row, flag in enumerate(flags) if not flag)
        self.frozen = frozen

    def drop_frozen_grads(self) -> None:
        """Zero the gradient rows of the trials' frozen parameters (:attr:`frozen`), which a fused backward fills."""
        if not self.frozen:
            return
        with torch.no_grad():
            for name, rows in self.frozen.items():
                grad = self.params[name].grad
                if grad is not None:
                    grad[list(rows)] = 0

    def adopt_trial_grads(self) -> None:
        """Add each gradient a backward put on a trial's own parameter into its row of the stacked gradient.

        A fused backward reaches the rows through the views a step ran with. Code that runs a trial's module again
        during the backward, after the step (reentrant activation checkpointing recomputes its block there), runs it
        on the module's own parameters, bound to their rows, and differentiates those: that gradient is the trial's
        too. It is added to the row, and the parameter's own dropped (a view of the stacked gradient is left alone).
        """
        for name, params in self._trial_params.items():  # (every backward on the loop: the cached parameters)
            stacked = self.params[name]
            for row, param in enumerate(params):
                grad = param.grad
                if grad is None or (stacked.grad is not None and _same_storage(grad, stacked.grad)):
                    continue
                if stacked.grad is None:
                    stacked.grad = torch.zeros_like(stacked)
                with torch.no_grad():
                    self.trial_view(name, row, stacked.grad[row]).add_(grad)
                param.grad = None

    def distribute_grads(self, rows: Iterable[int] | None = None) -> None:
        """Set each trial parameter's ``.grad`` to the view ``stacked.grad[row]``.

        None where it has none, and where the trial froze the parameter (:attr:`frozen`): alone it gets no gradient.
        """
        rows = range(self.size) if rows is None else list(rows)
        for name, stacked in self.params.items():  # (the trials' parameters as bind found them)
            params, grad, frozen = self._trial_params[name], stacked.grad, self.frozen.get(name, ())
            views = None if grad is None else grad.unbind(0)
            for row in rows:
                params[row].grad = None if views is None or row in frozen else self.trial_view(name, row, views[row])

    def clear_trial_grads(self, rows: Iterable[int] | None = None) -> None:
        """Drop the trials' gradient views (the stacked gradients are managed by the caller); ``rows``: only theirs."""
        rows = range(self.size) if rows is None else list(rows)
        for params in self._trial_params.values():
            for row in rows:
                params[row].grad = None

    def detach(self, module: nn.Module) -> None:
        """Give a trial module its own storage again (a copy of its current row): it leaves the group.

        The tensors its Python attributes hold let go of the group's autograd graphs
        (:func:`~lightning_hydro.stacking.held_graphs.release_held_graphs`).
        """
        release_held_graphs(module)
        with torch.no_grad():
            for param in module.parameters():
                param.data = param.data.clone()
                param.grad = None
            for name in self.buffers:
                _set_buffer(module, name, module.get_buffer(name).clone())

    def remove(self, rows: Sequence[int]) -> list[nn.Module]:
        """Remove the given rows: the stacked tensors shrink and the remaining trials are re-bound.

        Returns the removed trial modules, detached (each owns a copy of its last weights).
        """
        drop = set(rows)
        if not drop <= set(range(self.size)):
            raise IndexError(f"rows {sorted(drop)} out of range for a group of {self.size}")
        removed = [self.modules[r] for r in sorted(drop)]
        self.reorder([tid for r, tid in enumerate(self.trial_ids) if r not in drop])
        return removed

    def reorder(self, trial_ids: Sequence[int]) -> None:
        """Permute (and/or drop) rows so that the slots hold ``trial_ids`` in that order."""
        rows = [self.row_of(tid) for tid in trial_ids]
        dropped = [r for r in range(self.size) if r not in rows]
        for row in dropped:
            self.detach(self.modules[row])
        self._select_rows(rows)
        self.modules = [self.modules[r] for r in rows]
        self.trial_ids = list(trial_ids)
        self.bind()

    def append(self, module: nn.Module, trial_id: int) -> None:
        """Add a trial in a new last row, its tensors copied from the module, which is then bound."""
        live = self.modules[0] if self.modules else None  # of the reference's shapes (unpadded groups are uniform)
        _refuse(trial_id, "the group", self._reference, module, pad_widths=self.pad_widths, reference_module=live)
        self.true_shapes.append(_shapes(module))
        self._repad()  # a wider newcomer widens the group first
        with torch.no_grad():
            for name, stacked in self.params.items():
                row = module.get_parameter(name).detach().to(stacked.device, stacked.dtype)
                grad = stacked.grad  # a gradient being accumulated goes on; the newcomer's row starts at zero
                if grad is not None:
                    grad = torch.cat([grad, grad.new_zeros(1, *grad.shape[1:])])
                _resize(stacked, torch.cat([stacked.data, pad_to(row, stacked.shape[1:]).unsqueeze(0)]), grad)
            for name, stacked_buffer in self.buffers.items():
                row = module.get_buffer(name).to(stacked_buffer.device)
                self._replace_buffer(
                    name, torch.cat([stacked_buffer, pad_to(row, stacked_buffer.shape[1:]).unsqueeze(0)])
                )
        self.modules.append(module)
        self.trial_ids.append(trial_id)
        self.bind()

    def reshape_empty(self, shapes: Mapping[str, Shape]) -> None:
        """Give a group with no rows the stacked shapes ``shapes`` (``[0, ...]``, by parameter or buffer name).

        With ``pad_widths``, a group whose every row was removed keeps the padded shape of its last rows; a group
        rebuilt without rows (from a checkpoint written after every trial had left) takes the recorded shapes, so
        that the recorded tensors load into it.

        Raises:
            ValueError: if the group has rows, or a shape has rows.
        """
        if self.size or any(shape[:1] != (0,) for shape in shapes.values()):
            raise ValueError(
                f"reshape_empty: only a group without rows takes new shapes; this one has {self.size} rows and the "
                f"shapes asked for have {sorted({shape[0] for shape in shapes.values() if shape})} rows."
            )
        with torch.no_grad():
            for name, stacked in self.params.items():
                if name in shapes:
                    _resize(stacked, stacked.data.new_zeros(shapes[name]))
            for name, stacked_buffer in self.buffers.items():
                if name in shapes:
                    self._replace_buffer(name, stacked_buffer.new_zeros(shapes[name]))

    def _select_rows(self, rows: Sequence[int]) -> None:
        with torch.no_grad():
            for stacked in self.params.values():
                index = torch.as_tensor(list(rows), dtype=torch.long, device=stacked.device)
                grad = stacked.grad  # the rows kept keep a gradient being accumulated
                _resize(
                    stacked, stacked.data.index_select(0, index), None if grad is None else grad.index_select(0, index)
                )
            for name, stacked_buffer in self.buffers.items():
                index = torch.as_tensor(list(rows), dtype=torch.long, device=stacked_buffer.device)
                self._replace_buffer(name, stacked_buffer.index_select(0, index))
        self.true_shapes = [self.true_shapes[r] for r in rows]
        self._repad()

    def _repad(self) -> None:
        """Fit the stacked shapes to the largest of the rows' own shapes (only groups with ``pad_widths``)."""
        if not self.pad_widths or not self.true_shapes:
            return
        with torch.no_grad():
            for name, stacked in self.params.items():
                shape = padded_shape([shapes[name] for shapes in self.true_shapes])
                resized = _resized(stacked.data, shape)
                if resized is not None:
                    _resize(stacked, resized, None if stacked.grad is None else _resized(stacked.grad, shape))
            for name, stacked_buffer in self.buffers.items():
                resized = _resized(stacked_buffer, padded_shape([shapes[name] for shapes in self.true_shapes]))
                if resized is not None:
                    self._replace_buffer(name, resized)

    def _replace_buffer(self, name: str, value: Tensor) -> None:
        self.storage.register_buffer(storage_key(name), value, persistent=self._persistent[name])
        self.buffers[name] = value


def _resize(param: Tensor, data: Tensor, grad: Tensor | None = None) -> None:
    """Give a stacked parameter ``data`` of another shape (rows added, dropped or padded), and ``grad``.

    ``grad``: the gradient the rows had, in the new shape (None: none). Between two optimizer steps of
    ``accumulate_grad_batches`` it holds what the window's batches so far have added: dropped, the trials that
    stay would step on the window's later batches only.

    A parameter's gradient accumulator keeps the shape it was made with, and torch hands the same one to every later
    backward while any autograd graph made before still holds it: the outputs-list pattern of Lightning's docs
    (``self.training_step_outputs.append(loss)``) holds each step's graph to the epoch's end, and a trial stopped
    within the epoch made the next backward fail ("invalid gradient ... expected shape compatible with [3, 10]").
    ``.data`` of another dtype makes torch forget it (a new shape alone does not), so the next backward makes one of
    the new shape.
    """
    if data.shape != param.shape:
        param.data = data.new_empty(0, dtype=torch.float64 if data.dtype != torch.float64 else torch.float32)
    param.data, param.grad = data, grad


def _same_storage(a: Tensor, b: Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _shapes(module: nn.Module) -> dict[str, Shape]:
    shapes = {name: tuple(p.shape) for name, p in module.named_parameters()}
    shapes.update({name: tuple(b.shape) for name, b in module.named_buffers()})
    return shapes


def _resized(stacked: Tensor, shape: Shape) -> Tensor | None:
    """``[B, ...]`` rows cut or zero-padded to ``[B, *shape]`` (None if already so); rows fit in ``shape``."""
    if tuple(stacked.shape[1:]) == shape:
        return None
    common = tuple(min(have, want) for have, want in zip(stacked.shape[1:], shape))
    return pad_to(stacked[(slice(None), *true_region(common))], (stacked.shape[0], *shape)).contiguous()


def _non_persistent_buffer_names(module: nn.Module) -> set[str]:
    names: set[str] = set()
    for prefix, sub in module.named_modules():
        for leaf in sub._non_persistent_buffers_set:
            names.add(f"{prefix}.{leaf}" if prefix else leaf)
    return names
