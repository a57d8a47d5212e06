"""ConfigTrainerFactory: Lightning Trainers built from the app config's ``trainer`` and ``callbacks``.

Each call builds a fresh Trainer (and fresh user callbacks, so trials never share callback state) rooted in
one directory: a CSV logger writes ``logs/version_<n>/metrics.csv`` there (a new version per attempt:
Lightning's CSV logger would delete the previous file on a resume), and a ``ModelCheckpoint`` keeps
``checkpoints/last.ckpt`` after every epoch, which a rerun resumes from.

Example::

    >>> from pathlib import Path
    >>> import tempfile
    >>> factory = ConfigTrainerFactory({"max_epochs": 1, "enable_progress_bar": False})
    >>> root = Path(tempfile.mkdtemp())
    >>> trainer = factory(root_dir=root)
    >>> trainer.max_epochs, factory.last_checkpoint(root)
    (1, None)
"""

from __future__ import annotations

import logging
import os
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from hydra.utils import get_class, instantiate
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, Logger

__all__ = ["ConfigTrainerFactory"]

log = logging.getLogger(__name__)

_MANAGED = ("default_root_dir", "callbacks")
_CHECKPOINT_DIR = "checkpoints"


class ConfigTrainerFactory:
    """Builds Trainers from ``trainer`` keyword arguments and instantiable ``callbacks`` configs.

    Args:
        trainer_kwargs: keyword arguments of :class:`lightning.Trainer` (``logger`` may be ``true`` or
            ``false``; ``enable_checkpointing: false`` turns off the resume checkpoint); ``_target_``, if
            given, names the Trainer class (lightning-hydra-template's ``lightning.pytorch.trainer.Trainer``,
            or a subclass).
        callbacks: name -> config with ``_target_`` (``null`` entries are skipped).
        loggers: name -> Lightning logger config with ``_target_`` (``null`` entries are skipped); they log
            next to the CSV logger.

    Raises:
        ValueError: if ``trainer_kwargs`` sets what the factory manages (``default_root_dir``,
            ``callbacks``), gives ``logger`` something other than a bool, or names a ``_target_`` that
            is not a Trainer class.
    """

    def __init__(
        self,
        trainer_kwargs: Mapping[str, Any],
        callbacks: Mapping[str, Any] | None = None,
        *,
        loggers: Mapping[str, Any] | None = None,
    ) -> None:
        trainer_kwargs = dict(trainer_kwargs)
        self.trainer_class = _trainer_class(trainer_kwargs.pop("_target_", None))
        for key in _MANAGED:
            if key in trainer_kwargs:
                raise ValueError(
                    f"ConfigTrainerFactory: trainer.{key} is set by lightning_hydro (each trial's directory "
                    f"and callbacks), got {key}={trainer_kwargs[key]!r}. Fix: remove trainer.{key}; put "
                    "callbacks under the top-level 'callbacks' key."
                )
        logger = trainer_kwargs.get("logger", True)
        if not isinstance(logger, bool):
            raise ValueError(
                "ConfigTrainerFactory: trainer.logger must be true (a CSV logger in each run's directory) or "
                f"false, got {logger!r}. Fix: add other loggers as callbacks, or log from your module."
            )
        self.trainer_kwargs = {k: v for k, v in trainer_kwargs.items() if k != "logger"}
        self.use_logger = logger
        self.checkpointing = bool(trainer_kwargs.get("enable_checkpointing", True))
        self.callbacks_config = dict(callbacks or {})
        self.loggers_config = dict(loggers or {})

    def __call__(self, *, root_dir: Path, callbacks: Sequence[Callback] = (), **overrides: Any) -> L.Trainer:
        """A Trainer rooted in ``root_dir``: the app's callbacks, then ``callbacks``, then the checkpoint.

        ``overrides`` replace the app's Trainer settings for this Trainer (e.g. ``max_epochs``).
        """
        root_dir.mkdir(parents=True, exist_ok=True)
        all_callbacks: list[Callback] = [instantiate(c) for c in self.callbacks_config.values() if c is not None]
        all_callbacks += list(callbacks)
        if self.checkpointing:
            all_callbacks.append(_last_checkpoint_callback(root_dir / _CHECKPOINT_DIR))
        loggers: list[Logger] = [CSVLogger(root_dir, name="logs")] if self.use_logger else []
        loggers += [instantiate(c) for c in self.loggers_config.values() if c is not None]
        kwargs = {**self.trainer_kwargs, **overrides}
        return self.trainer_class(**kwargs, default_root_dir=root_dir, logger=loggers or False, callbacks=all_callbacks)

    def last_checkpoint(self, root_dir: Path) -> Path | None:
        """``<root_dir>/checkpoints/last.ckpt`` if it exists and is whole.

        A damaged one (e.g. truncated by a kill while it was written) is set aside as ``last.ckpt.corrupt``
        with a warning, and None returned: the run starts from scratch.
        """
        path = root_dir / _CHECKPOINT_DIR / "last.ckpt"
        if not (self.checkpointing and path.is_file()):
            return None
        problem = _checkpoint_problem(path)
        if problem is None:
            return path
        aside = path.with_name(path.name + ".corrupt")
        os.replace(path, aside)
        log.warning("%s is unreadable (%s); moved to %s, and the run starts from scratch.", path, problem, aside.name)
        return None


def _checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole ``torch.save`` file (a zip archive), or None; reads no pickle."""
    try:
        with zipfile.ZipFile(path) as archive:
            broken = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        return f"not a whole torch checkpoint: {err}"
    return None if broken is None else f"its member {broken} is damaged"


def _trainer_class(target: Any) -> type[L.Trainer]:
    if target is None:
        return L.Trainer
    try:
        cls = get_class(str(target))
    except Exception as err:
        raise ValueError(
            f"ConfigTrainerFactory: trainer._target_={target!r} cannot be imported ({err}). Expected a Trainer "
            "class, e.g. lightning.pytorch.trainer.Trainer. Fix: correct trainer._target_ or remove it."
        ) from err
    if not (isinstance(cls, type) and issubclass(cls, L.Trainer)):
        raise ValueError(
            f"ConfigTrainerFactory: trainer._target_={target!r} is not a lightning.Trainer (sub)class. Fix: "
            "e.g. trainer._target_=lightning.pytorch.trainer.Trainer, or remove it."
        )
    return cls


def _last_checkpoint_callback(dirpath: Path) -> ModelCheckpoint:
    # One file, ``last.ckpt``, rewritten after every epoch. (``save_top_k=0, save_last=True`` would only
    # write it at the end of fit, too late for a resume.)
    return ModelCheckpoint(dirpath=dirpath, filename="last", save_top_k=1, enable_version_counter=False)
