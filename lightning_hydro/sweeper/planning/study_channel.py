"""``StudyChannel``: the sweep's one model-based sampler, shared by the sweeper and every group job.

The sampler's state is an Optuna study in a storage every process of the sweep opens: by default a journal
file in the sweep directory (``<sweep_dir>/lightning_hydro/sampler.journal``: Optuna's ``JournalStorage``, safe
for the processes of one machine and for jobs on a shared file system that honours file locks), or the
database URL of ``hydra.sweeper.storage`` (``postgresql://...``: Optuna's ``RDBStorage``, for jobs on many
machines; each ask or tell is one short transaction, so hundreds of concurrent jobs are fine).

- the sweeper asks the first configurations (they decide the partitions and the groups);
- a group job asks a new configuration of its own partition whenever a slot frees (the partition's
  non-fusible values are fixed with Optuna's ``PartialFixedSampler``, the others are sampled);
- every rung value is reported as an intermediate value as it is recorded, and every trial is told when it
  ends (``completed``: its value; ``stopped``: pruned at its last rung; else failed), from whatever process.

Sweep trial ids ARE the study's trial numbers, which the storage hands out atomically: unique sweep-wide
however many jobs ask at once. A channel pickles as its :class:`ChannelSpec` (no open connection).

Example::

    >>> import tempfile
    >>> from pathlib import Path
    >>> from lightning_hydro.sweeper.planning.search_space import parse_search_space
    >>> lines = ("model.lr=tag(log, interval(1e-3, 1))", "data.batch_size=32,64")
    >>> spec = ChannelSpec(storage=str(Path(tempfile.mkdtemp()) / "s.journal"), sampler="tpe", seed=0,
    ...                    mode="max", space=lines)
    >>> channel = StudyChannel(spec)
    >>> [tid for tid, _ in channel.ask(2)]
    [0, 1]
    >>> tid, conf = channel.ask(1, fixed={"data.batch_size": "64"})[0]
    >>> tid, conf.texts["data.batch_size"]
    (2, '64')
    >>> channel.report(tid, 1, 0.9); channel.tell(tid, "completed", 0.95)
    >>> channel.configurations()[2].texts == conf.texts
    True
"""

from __future__ import annotations

import importlib
import math
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightning_hydro.sweeper.planning.samplers import optuna_distribution
from lightning_hydro.sweeper.planning.search_space import Choice, Configuration, SearchSpace, parse_search_space

__all__ = ["STUDY_NAME", "ChannelSpec", "StudyChannel", "is_learning_sampler"]

STUDY_NAME = "lightning_hydro"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+://")


def is_learning_sampler(name: str) -> bool:
    """Whether the sampler ``name`` learns from results (``tpe``, or an Optuna sampler class path)."""
    return name == "tpe" or "." in name


@dataclass(frozen=True)
class ChannelSpec:
    """What opens a sweep's channel in any process (JSON-ready: it travels in each group's spec).

    Attributes:
        storage: a journal file path, or a database URL (``postgresql://...``, ``sqlite:///...``).
        sampler: ``tpe``, or the import path of an Optuna sampler class (e.g. ``optuna.samplers.CmaEsSampler``),
            constructed with ``seed=``.
        seed: the sweep's seed; each ask seeds the sampler from it and the number of trials so far.
        mode: ``min`` or ``max``.
        space: the search space's override lines.
        study: the study's name in the storage (sweeps sharing a database need different names).
    """

    storage: str
    sampler: str
    seed: int
    mode: str
    space: tuple[str, ...]
    study: str = STUDY_NAME

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "storage": self.storage,
            "sampler": self.sampler,
            "seed": self.seed,
            "mode": self.mode,
            "space": list(self.space),
            "study": self.study,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChannelSpec:
        """Inverse of :meth:`to_json`."""
        return cls(
            str(data["storage"]),
            str(data["sampler"]),
            int(data["seed"]),
            str(data["mode"]),
            tuple(data["space"]),
            str(data.get("study", STUDY_NAME)),
        )


class StudyChannel:
    """Ask, report and tell through the sweep's shared Optuna study (see the module docstring).

    Raises:
        ImportError: if Optuna is not installed.
        ValueError: if ``spec.sampler`` names no Optuna sampler class.
    """

    def __init__(self, spec: ChannelSpec) -> None:
        try:
            import optuna
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                f"lightning_hydro sweeper: sampler {spec.sampler!r} needs Optuna: pip install "
                "'lightning-hydro[optuna]', or use hydra.sweeper.sampler=random."
            ) from err
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.spec = spec
        self._optuna = optuna
        self._space: SearchSpace = parse_search_space(spec.space)
        self._distributions = {dim.key: optuna_distribution(optuna, dim) for dim in self._space.dimensions}
        self._sampler_class = _sampler_class(optuna, spec.sampler)
        self._storage = self._open_storage(spec.storage)
        self._study = optuna.create_study(
            study_name=spec.study,
            storage=self._storage,
            direction="maximize" if spec.mode == "max" else "minimize",
            load_if_exists=True,
        )

    def __reduce__(self) -> tuple[type[StudyChannel], tuple[ChannelSpec]]:
        return (StudyChannel, (self.spec,))

    def _open_storage(self, storage: str) -> Any:
        storages = self._optuna.storages
        if _URL.match(storage):
            return storages.RDBStorage(storage)
        return storages.JournalStorage(storages.journal.JournalFileBackend(storage))

    def ask(self, n: int, *, fixed: Mapping[str, str] | None = None) -> list[tuple[int, Configuration]]:
        """Ask ``n`` new configurations (with the keys of ``fixed`` set to those override texts).

        Returns:
            ``(trial_id, configuration)`` pairs; the ids are the study's trial numbers.
        """
        out = []
        for _ in range(n):
            # numpy's seeds are 32-bit; the sweep's seed may be any int (a drawn one where the config says null)
            seed = (self.spec.seed * 1_000_003 + len(self._study.get_trials(deepcopy=False))) % 2**32
            sampler: Any = self._sampler_class(seed=seed)
            if fixed:
                params = {key: self._raw(key, text) for key, text in fixed.items()}
                with warnings.catch_warnings():  # experimental since Optuna 2.4, unchanged through 5.0
                    warnings.simplefilter("ignore", self._optuna.exceptions.ExperimentalWarning)
                    sampler = self._optuna.samplers.PartialFixedSampler(params, sampler)
            self._study.sampler = sampler
            trial = self._study.ask(self._distributions)
            out.append((trial.number, self._configuration(trial.params)))
        return out

    def report(self, trial_id: int, step: int, value: float) -> None:
        """Record ``value`` at ``step`` (a rung's budget) as the trial's intermediate value."""
        if not math.isfinite(value):
            return
        study_id = self._storage.get_study_id_from_name(self.spec.study)
        optuna_id = self._storage.get_trial_id_from_study_id_trial_number(study_id, trial_id)
        frozen = self._storage.get_trial(optuna_id)
        if frozen.state.is_finished():
            return
        self._storage.set_trial_intermediate_value(optuna_id, step, value)

    def tell(self, trial_id: int, status: str, value: float | None) -> None:
        """Tell how a trial ended: ``completed`` with ``value``, ``stopped`` (pruned), anything else failed."""
        state = self._optuna.trial.TrialState
        finite = value is not None and math.isfinite(value)
        if status == "completed" and finite:
            self._study.tell(trial_id, value, skip_if_finished=True)
        elif status == "stopped" and finite:
            self._study.tell(trial_id, state=state.PRUNED, skip_if_finished=True)
        else:
            self._study.tell(trial_id, state=state.FAIL, skip_if_finished=True)

    def configurations(self) -> dict[int, Configuration]:
        """Every trial asked so far (by any process), by id."""
        return {t.number: self._configuration(t.params) for t in self._study.get_trials(deepcopy=False)}

    def _raw(self, key: str, text: str) -> Any:
        dim = self._space.dimension(key)
        return text if isinstance(dim, Choice) else dim.at(float(text))[0]

    def _configuration(self, params: Mapping[str, Any]) -> Configuration:
        values, texts = {}, {}
        for dim in self._space.dimensions:
            raw = params[dim.key]
            value, text = dim.at(dim.texts.index(raw)) if isinstance(dim, Choice) else dim.at(raw)
            values[dim.key], texts[dim.key] = value, text
        return Configuration(values=values, texts=texts)


def _sampler_class(optuna: Any, name: str) -> Any:
    if name == "tpe":
        return optuna.samplers.TPESampler
    module_name, _, class_name = name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(
            f"lightning_hydro sweeper: sampler {name!r} names no importable class; expected 'tpe', 'random', "
            "'grid' or an Optuna sampler's import path, e.g. 'optuna.samplers.CmaEsSampler'."
        ) from err
    if not (isinstance(found, type) and issubclass(found, optuna.samplers.BaseSampler)):
        raise ValueError(
            f"lightning_hydro sweeper: sampler {name!r} is not an Optuna sampler class (a subclass of "
            "optuna.samplers.BaseSampler). Fix: e.g. hydra.sweeper.sampler=optuna.samplers.TPESampler."
        )
    return found
