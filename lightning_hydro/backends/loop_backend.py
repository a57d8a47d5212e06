"""The ``loop`` backend: the trials run one after another on the same batch.

Each trial's OWN module runs its own code (so Python attributes may differ between trials, torchmetrics
objects work, anything goes), with its parameters taken as differentiable views of its row of the stacked
tensors, so gradients still land in the stacked state. Always correct; the fallback and the baseline
that the other backends are measured against. Data loading is still shared by the group.

A parameter the forward writes in place (``nn.Embedding(max_norm=...)`` renormalises the rows it looks up) gets a
tensor of its own per trial instead of a view (torch forbids writing into one of ``unbind``'s views), and what the
trial's code wrote is copied back into its row: the trial's weight is renormalised, as alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_hydro.backends.base import Backend, StepOutputs, rows_without_output, stack_logs, stack_outputs
from lightning_hydro.backends.batch_copies import BatchRuns
from lightning_hydro.backends.errors import FusionError, user_frame
from lightning_hydro.backends.python_state import trial_code_ran
from lightning_hydro.backends.trial_logging import LogCall, capture_logs
from lightning_hydro.backends.vmap_backend import MethodCaller, call_method

__all__ = ["LoopBackend"]


class LoopBackend(Backend):
    """Runs the user's method once per trial, each with its own module and its row of the stacked state."""

    name = "loop"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._callers: list[MethodCaller] | None = None
        self._written: tuple[str, ...] = ()  # the parameters a forward writes in place (see the module docstring)

    @override
    def rebind(self) -> None:
        self._callers = None

    @override
    def run(self, method: str, *args: Any) -> StepOutputs:
        if self._callers is None:
            self._callers = [MethodCaller(module) for module in self.group.modules]
            self._written = written_in_forward(self.group.modules)
        trial_code_ran()  # each trial's own code changes its own state: a vectorised backend compares again
        outputs: list[Any] = []
        calls_per_row: list[list[LogCall]] = []
        # one unbind per parameter, not p[row] per trial: the backward of indexing allocates a whole [B, ...]
        # zero gradient per trial (quadratic in B), unbind's stacks the B row gradients once
        rows = {name: p.unbind(0) for name, p in self.group.params.items()}
        for name in self._written:  # a copy per row, written back below (a clone's backward is the identity)
            rows[name] = tuple(row.clone() for row in rows[name])
        frozen = self.group.frozen  # rows whose trial froze the parameter: no gradient flows there, as alone
        reassigned: dict[str, dict[int, Tensor]] = {}  # the buffers each trial's step reassigned, by name and row
        batches = BatchRuns(args, len(self._callers))  # each trial's step gets the batch as the loader gave it
        own_batches: list[Any] = []  # each trial's batch as its step left it (its batch-end hooks get it)
        for row, caller in enumerate(self._callers):
            # each trial at its own width (a group with pad_widths holds zero-padded rows)
            params = {
                f"module.{name}": self.group.trial_view(
                    name, row, p[row].detach() if row in frozen.get(name, ()) else p[row]
                )
                for name, p in rows.items()
            }
            buffers = {
                f"module.{name}": self.group.trial_view(name, row, b[row]) for name, b in self.group.buffers.items()
            }
            versions = [rows[name][row]._version for name in self._written]
            own_args = batches.next()
            own_batches.append(own_args[0] if own_args else None)
            with capture_logs(caller.module) as calls:
                try:
                    output, new_buffers = call_method(caller, params, buffers, method, own_args)
                except RuntimeError as err:
                    if not _UNBIND_VIEW_WRITTEN.search(str(err)):
                        raise
                    raise _in_place_write_error(err, type(caller.module).__name__) from err
            self._write_back(row, rows, versions)
            outputs.append(output)
            for name, value in new_buffers.items():
                reassigned.setdefault(name, {})[row] = value
            calls_per_row.append(calls)
        if reassigned:  # new tensors, as alone: the old ones may be saved for the backward pass
            self.group.replace_buffers(
                {name: self.group.with_rows(name, values) for name, values in reassigned.items()}
            )
        strict = method != "predict_step"
        return StepOutputs(
            output=stack_outputs(outputs, method, strict=strict),
            logs=stack_logs(calls_per_row, self.group.device),
            per_row=outputs,
            without_output=rows_without_output(outputs) if strict else (),
            batches=own_batches,
        )

    def _write_back(self, row: int, rows: Mapping[str, Sequence[Tensor]], versions: list[int]) -> None:
        """Copy what the trial's code wrote into its own copies of parameters (:attr:`_written`) into its rows."""
        for name, version in zip(self._written, versions):
            own = rows[name][row]
            if own._version != version:
                with torch.no_grad():  # (.data: the copies, not the rows, are what the step's graph saved)
                    self.group.params[name].data[row].copy_(own)


# torch's refusal to write into one of unbind's views ("Output 0 of Unbind is a view", "... of UnbindBackward0 ..."
# in torch 2.11)
_UNBIND_VIEW_WRITTEN = re.compile(r"Output \d+ of Unbind\w* is a view")


def written_in_forward(modules: Sequence[nn.Module]) -> tuple[str, ...]:
    """The parameters some trial's forward writes in place: an ``Embedding`` or ``EmbeddingBag`` with ``max_norm``."""
    found: dict[str, None] = {}
    for module in modules:
        names = {id(param): name for name, param in module.named_parameters()}  # (a tied weight: its stacked name)
        for sub in module.modules():
            if isinstance(sub, (nn.Embedding, nn.EmbeddingBag)) and sub.max_norm is not None:
                name = names.get(id(sub.weight))
                if name is not None:
                    found[name] = None
    return tuple(found)


def _in_place_write_error(err: RuntimeError, module_name: str) -> FusionError:
    return FusionError(
        f"FusedLightningModule(backend='loop'): {module_name}'s code writes a parameter in place ({user_frame(err)}), "
        "where the loop gives each trial a view of its row of the stacked parameter, which torch does not let code "
        "write. The loop copes with nn.Embedding(max_norm=...) and nn.EmbeddingBag(max_norm=...) modules; use one of "
        "them in place of F.embedding(..., max_norm=...) on a parameter, write the parameter under torch.no_grad() "
        "in a hook (on_train_batch_start), or use backend='vmap'."
    )
