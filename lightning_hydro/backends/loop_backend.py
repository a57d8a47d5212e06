"""The ``loop`` backend: the trials run one after another on the same batch.

Each trial's OWN module runs its own code (so Python attributes may differ between trials, torchmetrics
objects work, anything goes), with its parameters taken as differentiable views of its row of the stacked
tensors, so gradients still land in the stacked state. Always correct; the fallback and the baseline
that the other backends are measured against. Data loading is still shared by the group.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from typing_extensions import override

from lightning_hydro.backends.base import Backend, StepOutputs, rows_without_output, stack_logs, stack_outputs
from lightning_hydro.backends.batch_copies import BatchRuns
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

    @override
    def rebind(self) -> None:
        self._callers = None

    @override
    def run(self, method: str, *args: Any) -> StepOutputs:
        if self._callers is None:
            self._callers = [MethodCaller(module) for module in self.group.modules]
        trial_code_ran()  # each trial's own code changes its own state: a vectorised backend compares again
        outputs: list[Any] = []
        calls_per_row: list[list[LogCall]] = []
        # one unbind per parameter, not p[row] per trial: the backward of indexing allocates a whole [B, ...]
        # zero gradient per trial (quadratic in B), unbind's stacks the B row gradients once
        rows = {name: p.unbind(0) for name, p in self.group.params.items()}
        frozen = self.group.frozen  # rows whose trial froze the parameter: no gradient flows there, as alone
        reassigned: dict[str, dict[int, Tensor]] = {}  # the buffers each trial's step reassigned, by name and row
        batches = BatchRuns(args, len(self._callers))  # each trial's step gets the batch as the loader gave it
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
            with capture_logs(caller.module) as calls:
                output, new_buffers = call_method(caller, params, buffers, method, batches.next())
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
        )
