"""The backend each model ran on in a sweep, kept in the sweep directory for the groups that follow.

``backend="auto"`` times the candidate backends on a group's first batch. Within a process that choice is
cached, but every group job is a process of its own, and timing each group again costs seconds and, on a
loaded machine, may pick differently from group to group. A sweep job therefore looks up its model's
signature (the module class and every parameter's name, shape and dtype: what fusion depends on, not the
hyperparameters) in ``<sweep_dir>/lightning_hydro/backends.json``: the first group of a model chooses by
timing, the later ones run on its choice.

Example::

    >>> import tempfile
    >>> from pathlib import Path
    >>> from lightning_hydro.demos import DigitsMLP
    >>> cache = BackendCache(Path(tempfile.mkdtemp()) / "backends.json")
    >>> signature = model_signature(DigitsMLP(hidden_dim=8))
    >>> cache.backend_for(signature, "auto") is None
    True
    >>> cache.record(signature, ["vmap", "vmap", "loop"])
    >>> cache.backend_for(signature, "auto"), cache.backend_for(model_signature(DigitsMLP(hidden_dim=16)), "auto")
    ('vmap', None)
    >>> cache.backend_for(signature, "loop")   # a backend the user pinned wins
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch

from lightning_hydro.sweeper.json_files import read_json, write_json_atomic

__all__ = ["BACKEND_FILE", "BackendCache", "model_signature"]

BACKEND_FILE = "backends.json"
_FUSED_BACKENDS = ("vmap", "hfta", "loop")


def model_signature(module: torch.nn.Module) -> str:
    """A short hash of the module's class and its parameters' names, shapes and dtypes."""
    parts = [f"{type(module).__module__}.{type(module).__qualname__}"]
    parts += [f"{name}:{tuple(p.shape)}:{p.dtype}" for name, p in module.named_parameters()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


class BackendCache:
    """``{model signature: backend}`` in a JSON file shared by a sweep's jobs.

    Args:
        path: the file (created when the first choice is recorded).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def backend_for(self, signature: str, configured: str) -> str | None:
        """The backend an earlier group of this model ran on, if ``configured`` is ``auto``; else ``None``."""
        if configured != "auto":
            return None
        found = (read_json(self.path) or {}).get(signature)
        return found if found in _FUSED_BACKENDS else None

    def record(self, signature: str, backends: Iterable[str]) -> None:
        """Record the backend most of a group's trials ran on (a trial left alone may have moved to ``loop``)."""
        counts = Counter(b for b in backends if b in _FUSED_BACKENDS)
        if not counts:
            return
        known = read_json(self.path) or {}
        if signature in known:
            return
        known[signature] = counts.most_common(1)[0][0]
        write_json_atomic(self.path, known)
