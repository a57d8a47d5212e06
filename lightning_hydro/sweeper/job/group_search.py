"""The job side of the sweep-wide search: one rung store and one sampler shared by every group job.

A group job plugs into its early-stopping callback through the callback's own arguments:

- ``storage=`` :func:`sweep_rung_store`: the sweep's rung store (SQLite file in the sweep directory, or
  ``hydra.sweeper.storage``), so that every decision ranks a trial against every trial of the sweep at that
  rung; wrapped in :class:`ForwardingRungStore` when the sampler learns, so that each recorded rung value
  is reported to the sampler as it arrives;
- ``refill=`` :meth:`GroupSearch.refill`: a freed slot first takes the group's planned trials, then asks the
  sweep's sampler for a new configuration of the group's partition, until the group's quota is reached.

:class:`TrialTeller` tells the sampler how each trial ended (stopped: pruned; completed: its value) at the
validation that decided it. Asked trials are recorded in ``<job_dir>/asked_trials.json`` before they start,
so that a resumed job rebuilds them (the refill source's draw count says which) instead of asking again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_hydro.stopping import RungStore, open_store
from lightning_hydro.stopping.rung_record import RungEntry, RungRecord
from lightning_hydro.stopping.rung_store import AppendResult
from lightning_hydro.sweeper.group_spec import EarlyStoppingSpec, trial_seed
from lightning_hydro.sweeper.job.early_stopping import SWEEP_TRIAL_PREFIX
from lightning_hydro.sweeper.json_files import read_json, write_json_atomic
from lightning_hydro.sweeper.planning.study_channel import ChannelSpec, StudyChannel

__all__ = [
    "ASKED_FILE",
    "ForwardingRungStore",
    "GroupSearch",
    "TrialTeller",
    "group_stopping",
    "sweep_rung_store",
    "sweep_trial",
]

log = logging.getLogger(__name__)

ASKED_FILE = "asked_trials.json"


def sweep_trial(key: Any) -> int | None:
    """The sweep trial id of a rung store key (``"sweep/12"`` -> 12), or ``None`` for another key."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    prefix, _, number = str(key).partition("/")
    return int(number) if prefix == SWEEP_TRIAL_PREFIX and number.isdigit() else None


class ForwardingRungStore(RungStore):
    """A rung store that reports every newly recorded value to the sweep's sampler (``channel.report``).

    Everything else is the wrapped store's: the records, the transaction, the checkpoint state.

    Args:
        inner: the sweep's rung store.
        channel: the sweep's sampler.
    """

    def __init__(self, inner: RungStore, channel: StudyChannel) -> None:
        self.inner = inner
        self.channel = channel
        self.namespace = inner.namespace

    @override
    def append(self, entries: Sequence[RungEntry]) -> AppendResult:
        result = self.inner.append(entries)
        for entry, new in zip(entries, result.inserted):
            trial_id = sweep_trial(entry.trial_id)
            if new and trial_id is not None:
                self.channel.report(trial_id, entry.budget, entry.value)
        return result

    @override
    def claim_settings(self, bracket: int, settings: Mapping[str, Any]) -> None:
        self.inner.claim_settings(bracket, settings)

    @override
    def records(self, *, bracket: int | None = None, milestone: int | None = None) -> list[RungRecord]:
        return self.inner.records(bracket=bracket, milestone=milestone)

    @property
    @override
    def location(self) -> str:
        return self.inner.location

    @override
    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    @override
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.inner.load_state_dict(state)

    @override
    def close(self) -> None:
        self.inner.close()

    # The primitives are the wrapped store's (append and claim_settings above never reach them).
    @override
    def _atomically(self, work: Callable[[Any], Any]) -> Any:
        return self.inner._atomically(work)

    @override
    def _find(self, handle: Any, entry: RungEntry) -> RungRecord | None:
        return self.inner._find(handle, entry)

    @override
    def _insert(self, handle: Any, entry: RungEntry) -> RungRecord:
        return self.inner._insert(handle, entry)

    @override
    def _rung_records(self, handle: Any, bracket: int, milestone: int) -> list[RungRecord]:
        return self.inner._rung_records(handle, bracket, milestone)

    @override
    def _read_settings(self, handle: Any, bracket: int) -> dict[str, Any] | None:
        return self.inner._read_settings(handle, bracket)

    @override
    def _write_settings(self, handle: Any, bracket: int, settings: dict[str, Any]) -> None:
        self.inner._write_settings(handle, bracket, settings)


@dataclass(frozen=True)
class GroupSearch:
    """A group's part in the sweep-wide search (the ``search`` section of its spec).

    Attributes:
        channel: the sweep's sampler, or ``None`` when it does not learn (grid, random: planned trials only).
        quota: trials this group may start in all (planned ones included).
        planned: the group's planned trials (in its spec; they count against the quota).
        partition: the group's non-fusible values (fixed in every configuration it asks for).
        fusible: the keys whose override lines make a trial's config from the job's config.
        prefixes: ``+``/``++`` of each swept key (as the search space writes it).
        seeds: ``(config seed or None, sweep seed)``: an asked trial's seed is ``trial_seed(*seeds, trial_id)``.
        job_dir: where the asked trials are recorded.
    """

    channel: StudyChannel | None
    quota: int
    planned: int
    partition: dict[str, str]
    fusible: tuple[str, ...]
    prefixes: dict[str, str]
    seeds: tuple[int | None, int]
    job_dir: Path

    @classmethod
    def from_spec(cls, data: Mapping[str, Any], job_dir: Path) -> GroupSearch | None:
        """The group's search from its spec's ``search`` section (``None`` if it has none)."""
        if not data or data.get("channel") is None:
            return None
        return cls(
            channel=StudyChannel(ChannelSpec.from_json(data["channel"])),
            quota=int(data["quota"]),
            planned=int(data["planned"]),
            partition={str(k): str(v) for k, v in data["partition"]},
            fusible=tuple(data["fusible"]),
            prefixes=dict(data.get("prefixes", {})),
            seeds=(data["seeds"][0], int(data["seeds"][1])),
            job_dir=job_dir,
        )

    def asked(self) -> dict[int, list[str]]:
        """The trials this group asked so far (in any earlier attempt too): their override lines, by id."""
        data = read_json(self.job_dir / ASKED_FILE) or {"asked": []}
        return {int(tid): list(lines) for tid, lines in data["asked"]}

    def overrides(self, trial_id: int) -> list[str] | None:
        """The override lines of a trial this group asked, or ``None``."""
        return self.asked().get(trial_id)

    def seed(self, trial_id: int) -> int:
        """The seed an asked trial's module is built with (as the sweeper seeds its planned trials)."""
        return trial_seed(self.seeds[0], self.seeds[1], trial_id)

    def refill(
        self, waiting: Sequence[int], build: Callable[[int], L.LightningModule]
    ) -> Callable[[int], tuple[int, L.LightningModule] | None]:
        """The ``refill=`` factory: the group's ``waiting`` trials, then new ones asked of the sweep's sampler.

        Draw ``i < len(waiting)`` is ``waiting[i]``; later draws ask for a configuration of the group's partition
        while the group's quota allows. A draw that an earlier attempt of the job made returns the same trial (resume).
        """

        def draw(index: int) -> tuple[int, L.LightningModule] | None:
            if index < len(waiting):
                return waiting[index], build(waiting[index])
            asked = list(self.asked().items())
            k = index - len(waiting)
            if k < len(asked):
                return asked[k][0], build(asked[k][0])
            if self.channel is None or self.planned + k >= self.quota:
                return None
            ((trial_id, configuration),) = self.channel.ask(1, fixed=self.partition)
            lines = [f"{self.prefixes.get(key, '')}{key}={configuration.texts[key]}" for key in self.fusible]
            write_json_atomic(self.job_dir / ASKED_FILE, {"asked": [*([t, v] for t, v in asked), [trial_id, lines]]})
            log.info("lightning_hydro: trial %d asked of the sweep's sampler: %s", trial_id, " ".join(lines))
            return trial_id, build(trial_id)

        return draw


class TrialTeller(Callback):
    """Tells the sweep's sampler how each trial of a fused group ended, as soon as a decision ends it.

    Place it after the early-stopping callback (it reads the decisions that callback applied).
    """

    def __init__(self, channel: StudyChannel, monitor: str) -> None:
        self.channel = channel
        self.monitor = monitor
        self._told: set[int] = set()

    def _tell_ended(self, pl_module: L.LightningModule) -> None:
        from lightning_hydro.fused import FusedLightningModule

        if not isinstance(pl_module, FusedLightningModule):
            return
        for trial_id, result in pl_module.results.items():
            if result["status"] == "running" or trial_id in self._told:
                continue
            self._told.add(trial_id)
            value = result["metrics"].get(self.monitor)
            self.channel.tell(trial_id, str(result["status"]), None if value is None else float(value))

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._tell_ended(pl_module)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self._tell_ended(pl_module)


def sweep_rung_store(url: str, channel: StudyChannel | None, namespace: str = SWEEP_TRIAL_PREFIX) -> RungStore:
    """The sweep's rung store at ``url`` (the sweep's ``namespace``), forwarding to ``channel`` if given."""
    store = open_store(url, namespace=namespace)
    return store if channel is None else ForwardingRungStore(store, channel)


def group_stopping(spec: EarlyStoppingSpec, search: GroupSearch | None) -> tuple[RungStore | None, list[Callback]]:
    """The sweep's rung store for a group's early-stopping callback, and the callbacks that go after it."""
    channel = None if search is None else search.channel
    store = None if spec.storage is None else sweep_rung_store(spec.storage, channel, spec.namespace)
    return store, ([] if channel is None else [TrialTeller(channel, spec.metric)])
