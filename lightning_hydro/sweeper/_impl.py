"""The ``lightning_hydro`` sweeper's logic (the public class in ``hydra_plugins`` forwards here).

A sweep, start to end:

1. validate the settings, parse the search space, check its keys against the config (no job yet);
2. open (or resume) the plan in ``<sweep_dir>/lightning_hydro/plan.json``;
3. in rounds: ask the sampler for configurations, partition them by non-fusible values, cap each group by
   the fusion limit (probe jobs measure it for ``auto``), launch every group of the round as one job of
   the configured launcher, read each job's ``group_result.json`` and tell the sampler;
4. retrain the top-k configurations as final jobs, if asked;
5. write ``results.json``, ``results.csv`` and ``plots/``, and log a table of the best trials.

A rerun with the same ``hydra.sweep.dir`` skips finished groups and relaunches the others.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, ListConfig, OmegaConf

from lightning_hydro.sweeper.app_config import SEED_KEY, TRAINER_KEY, check_sweep_keys
from lightning_hydro.sweeper.group_spec import (
    ERROR_FILE,
    RESULT_FILE,
    STATE_DIR,
    EarlyStoppingSpec,
    GroupSpec,
    TrialSpec,
    group_launch_overrides,
    spec_path,
    trial_seed,
)
from lightning_hydro.sweeper.job.group_task import GroupTask
from lightning_hydro.sweeper.job.rank_relaunch import RelaunchedJob, relaunched_job
from lightning_hydro.sweeper.json_files import write_json_atomic
from lightning_hydro.sweeper.planning.device_plan import DevicePlan, device_env_override, visible_gpus
from lightning_hydro.sweeper.planning.fusion_report import warn_if_nothing_fuses
from lightning_hydro.sweeper.planning.grouping import (
    fused_options,
    is_width_refusal,
    launch_report,
    plan_padded_groups,
    split_refused,
    width_keys,
)
from lightning_hydro.sweeper.planning.launch_rules import TrainerPlacement, check_launch, launcher_kind, plan_devices
from lightning_hydro.sweeper.planning.plots import plot_in_background
from lightning_hydro.sweeper.planning.reports import format_best_table, metric_value, rank_trials, write_results
from lightning_hydro.sweeper.planning.samplers import GridSampler, Sampler, SamplerFeedback, TPESampler, make_sampler
from lightning_hydro.sweeper.planning.search_space import Interval, override_key, parse_search_space
from lightning_hydro.sweeper.planning.settings import SweepSettings
from lightning_hydro.sweeper.planning.study_channel import STUDY_NAME, ChannelSpec, StudyChannel
from lightning_hydro.sweeper.planning.sweep_search import (
    absorb_asked_trials,
    partition_quotas,
    rung_storage,
    sampler_storage,
    search_section,
    sweep_name,
)
from lightning_hydro.sweeper.planning.sweep_state import SweepState
from lightning_hydro.sweeper.planning.trial_groups import (
    Partition,
    Trial,
    TrialGroup,
    partition_label,
    partition_of,
    plan_groups,
)

__all__ = ["LightningHydroSweeperImpl"]

log = logging.getLogger(__name__)

_DEFAULT_TPE_ROUND = 16


class LightningHydroSweeperImpl(Sweeper):
    """See the module docstring; arguments: the fields of ``hydra.sweeper``, checked by :meth:`sweep`."""

    def __init__(self, **settings: Any) -> None:
        self._raw_settings = settings
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Launcher | None = None
        self._job_idx = 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep the context and create the configured launcher."""
        self.config = config
        self.hydra_context = hydra_context
        # The jobs run the user's task function through GroupTask: it points the job's model node at the
        # group's fused trials and reports failures with their traceback (see group_task.py).
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=GroupTask(task_function), config=config
        )

    def sweep(self, arguments: list[str]) -> list[dict[str, Any]]:
        """Run (or resume) the sweep; return one record per trial.

        Raises:
            ValueError: for invalid settings or search space (before any job starts).
            RuntimeError: if jobs failed (after writing the results of the others).
        """
        if self.config is None or self.launcher is None:
            raise RuntimeError("LightningHydroSweeperImpl.sweep: call setup() first.")
        relaunched = relaunched_job()
        if relaunched is not None:  # a further DDP rank of one group's fit, not a second sweep
            return self._run_relaunched(relaunched)
        self.settings = SweepSettings.from_config(**self._raw_settings)
        self.devices = self._plan_devices()
        lines = [*self.settings.params, *arguments]
        self.space = parse_search_space(lines)
        swept = {dim.key: dim.prefix for dim in self.space.dimensions}
        check_sweep_keys(self.config, swept, self.settings.non_fusible)
        self.fusible = [k for k in self.space.keys if k not in self.settings.non_fusible]
        self.padded_keys: list[str] = []
        self.sampler: Sampler | None = None
        if not self.settings.continuous:
            self.sampler = make_sampler(
                self.settings.sampler,
                self.space,
                seed=self.settings.seed,
                mode=self.settings.mode,
                n_trials=self.settings.n_trials,
            )
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        (sweep_dir / STATE_DIR).mkdir(parents=True, exist_ok=True)
        self.channel: StudyChannel | None = None
        if self.settings.continuous:  # the sweep's one sampler, shared with every group job
            spec = ChannelSpec(
                storage=sampler_storage(sweep_dir, self.settings.storage),
                sampler=self.settings.sampler,
                seed=self.settings.seed,
                mode=self.settings.mode,
                space=tuple(lines),
                study=STUDY_NAME if self.settings.storage is None else sweep_name(sweep_dir, self.settings.storage),
            )
            self.channel = StudyChannel(spec)
        self.rung_storage = rung_storage(sweep_dir, self.settings.storage)
        self.rung_namespace = sweep_name(sweep_dir, self.settings.storage)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        self.state = SweepState.open(sweep_dir, self.settings.request(lines))
        self.failures: dict[str, BaseException] = {}
        self._told: set[int] = set()
        self._launched_before = any(self.state.result(g) is not None for g in self.state.groups)

        self._search()
        retrained = self._retrain()
        records = [self._record(g, tid) for g in self.state.groups_of_kind("search") for tid in g.trial_ids]
        self._report(records, retrained)
        if self.failures:
            failed = "; ".join(f"{gid}: {_one_line(err)}" for gid, err in self.failures.items())
            raise RuntimeError(
                f"lightning_hydro sweeper: {len(self.failures)} job(s) failed ({failed}). Their trials are "
                "marked 'failed' in results.json. Fix the cause, then re-run the same command (same "
                "hydra.sweep.dir): finished groups are kept, failed ones are retried."
            )
        return records

    # -- search -----------------------------------------------------------------------------------------

    def _search(self) -> None:
        n_target = self._n_target()
        if self.sampler is not None:
            self.sampler.skip(len(self.state.trials))
        for group in self.state.groups_of_kind("search"):
            self._tell(self._absorb(group))
        while True:
            pending = [
                g
                for g in self.state.groups_of_kind("search")
                if self.state.result(g) is None and g.group_id not in self.failures
            ]
            if not pending:
                n_new = min(n_target - len(self.state.trials), self._round_size(n_target))
                if n_new <= 0:
                    return
                pending = self._plan_round(n_new)
            self._launch([(self._search_spec(g), self._job_overrides(g)) for g in pending])
            pending = [self._absorb(group) for group in self._split_refused(pending)]
            for group in pending:
                self._tell(group)
            self._check_metric_logged(pending)

    def _split_refused(self, groups: list[TrialGroup]) -> list[TrialGroup]:
        """Replace each group whose width padding was refused by identical-width groups, to launch next."""
        kept = []
        for group in groups:
            err = self.failures.get(group.group_id)
            if err is None or not is_width_refusal(err) or not self._padded_in(group.partition):
                kept.append(group)
                continue
            del self.failures[group.group_id]
            self.state.groups.remove(group)
            self.state.add([], split_refused(group, self._trials_of(group), self._padded_in(group.partition)))
            log.warning("lightning_hydro: %s split into identical-width groups: %s", group.group_id, _one_line(err))
        return kept

    def _absorb(self, group: TrialGroup) -> TrialGroup:
        """The group, with the trials its job asked of the sweep's sampler added to it and to the plan."""
        return group if self.channel is None else absorb_asked_trials(self.state, group, self.channel)

    def _n_target(self) -> int:
        if isinstance(self.sampler, GridSampler):
            return self.sampler.max_trials
        if self.settings.n_trials is None:  # pragma: no cover - rejected by SweepSettings
            raise ValueError("n_trials is required")
        return self.settings.n_trials

    def _round_size(self, n_target: int) -> int:
        if self.settings.round_size is not None:
            return self.settings.round_size
        if isinstance(self.sampler, TPESampler) or self.channel is not None:
            limit = self.settings.fusion_limit
            return limit if isinstance(limit, int) else _DEFAULT_TPE_ROUND
        return n_target

    def _plan_round(self, n_new: int) -> list[TrialGroup]:
        if self.channel is not None:  # the sweep's sampler numbers its trials itself
            trials = [Trial(tid, conf) for tid, conf in self.channel.ask(n_new)]
        else:
            assert self.sampler is not None
            first_id = len(self.state.trials)
            ids = list(range(first_id, first_id + n_new))
            trials = [Trial(tid, conf) for tid, conf in zip(ids, self.sampler.ask(ids))]
        # Continuous search asks freed slots for any width: padded groups plan widths up front, so not there.
        padding = self.settings.pad_widths and self.channel is None
        self.padded_keys = width_keys(trials, self.settings.non_fusible) if padding else []
        if self.settings.fusion_limit == "auto":
            self._probe_fusion_limits(trials)
        refill = self.settings.scheduler.name != "none" and self.settings.scheduler.refill
        if self.padded_keys:
            groups, overheads = plan_padded_groups(
                trials,
                non_fusible=self.settings.non_fusible,
                widths=self.padded_keys,
                fusion_limit=self._fusion_limit,
                refill=refill,
                max_overhead=self.settings.max_padding_overhead,
                first_index=len(self.state.groups_of_kind("search")),
            )
            log.info("%s", launch_report(groups, self.padded_keys, overheads))
        else:
            groups = plan_groups(
                trials,
                non_fusible=self.settings.non_fusible,
                fusion_limit=self._fusion_limit,
                refill=refill,
                first_index=len(self.state.groups_of_kind("search")),
            )
        if self.channel is not None:  # each partition's group asks for its share of the rest as slots free
            groups = self._with_quotas(groups, len(self.state.trials) + len(trials))
        self.state.add(trials, groups)
        splitting = [k for k in self.settings.non_fusible if k not in self.padded_keys]
        warn_if_nothing_fuses(groups, splitting, self.space.keys)
        sizes = ", ".join(f"{g.group_id}: {len(g.trial_ids)} [{partition_label(g.partition)}]" for g in groups)
        log.info("lightning_hydro: %d new trials in %d groups (%s)", len(trials), len(groups), sizes)
        return groups

    def _with_quotas(self, groups: list[TrialGroup], asked: int) -> list[TrialGroup]:
        """Give each group its partition's share of the trials not asked yet; slots: min(fusion limit, quota)."""
        counts = {g.group_id: len(g.trial_ids) for g in groups}
        quotas = partition_quotas(counts, sum(counts.values()) + max(0, self._n_target() - asked))
        self.state.quotas.update(quotas)
        return [dataclasses.replace(g, slots=min(self._fusion_limit(g.partition), quotas[g.group_id])) for g in groups]

    def _fusion_limit(self, partition: Partition) -> int:
        limit = self.settings.fusion_limit
        if isinstance(limit, int):
            return limit
        measured = self.state.fusion_limit(partition)
        if measured is None:  # pragma: no cover - _probe_fusion_limits ran first
            raise RuntimeError(f"no fusion limit measured for {partition_label(partition)}")
        return measured

    def _probe_fusion_limits(self, trials: Sequence[Trial]) -> None:
        """Launch one probe job per partition whose limit is unknown; record each measured limit."""
        by_partition: dict[Partition, list[Trial]] = {}
        for trial in trials:
            splitting = [k for k in self.settings.non_fusible if k not in self.padded_keys]
            partition = partition_of(trial.configuration, splitting)
            if self.state.fusion_limit(partition) is None:
                by_partition.setdefault(partition, []).append(trial)
        jobs, probes = [], []
        for i, (partition, members) in enumerate(by_partition.items()):
            ids = tuple(t.trial_id for t in members[:2])
            group = TrialGroup(f"probe_{len(self.state.fusion_limits) + i:04d}", "probe", ids, len(ids), partition)
            (self.state.job_dir(group) / RESULT_FILE).unlink(missing_ok=True)
            spec = self._spec(group, self._trial_overrides(members[:2], partition), members[:2])
            sharing = self.settings.groups_per_device if self.devices is not None else 1  # jobs on one GPU at once
            probe = {**dataclasses.asdict(self.settings.probe), "groups_per_device": sharing}
            spec = dataclasses.replace(spec, probe=probe)
            jobs.append((spec, self._job_overrides(group)))
            probes.append(group)
        self._launch(jobs)
        for group in probes:
            result = self.state.result(group)
            if group.group_id in self.failures or result is None:
                cause = self.failures.get(group.group_id)
                raise RuntimeError(
                    "lightning_hydro sweeper: the fusion-limit probe of partition "
                    f"'{partition_label(group.partition)}' failed "
                    f"({_one_line(cause) if cause else 'no result'}). Fix the cause, or set "
                    "hydra.sweeper.fusion_limit to a number."
                ) from cause
            self.state.set_fusion_limit(group.partition, int(result["fusion_limit"]))
            log.info(
                "lightning_hydro: fusion limit %d for [%s]",
                result["fusion_limit"],
                partition_label(group.partition),
            )

    # -- jobs -------------------------------------------------------------------------------------------

    def _trial_overrides(
        self, trials: Sequence[Trial], partition: Partition, drop: Sequence[str] = ()
    ) -> dict[int, list[str]]:
        """Each trial's own override lines (fusible keys and the widths its group pads), less ``drop``."""
        keys = [k for k in [*self.fusible, *self._padded_in(partition)] if k not in drop]
        return {t.trial_id: self.space.override_lines(t.configuration.texts, keys) for t in trials}

    def _padded_in(self, partition: Partition) -> list[str]:
        """The searched non-fusible keys a group's trials may differ in: its padded widths."""
        shared = dict(partition)
        return [k for k in self.settings.non_fusible if k in self.space.keys and k not in shared]

    def _trials_of(self, group: TrialGroup) -> list[Trial]:
        return [self.state.trials[tid] for tid in group.trial_ids]

    def _spec(
        self, group: TrialGroup, overrides: Mapping[int, list[str]], trials: Sequence[Trial] | None = None
    ) -> GroupSpec:
        return GroupSpec(
            group_id=group.group_id,
            kind=group.kind,
            slots=group.slots,
            trials=tuple(TrialSpec(tid, tuple(overrides[tid]), self._seed(tid)) for tid in group.trial_ids),
            fused=fused_options(
                self._fused_options(),
                self._trials_of(group) if trials is None else trials,  # a probe's trials are not planned yet
                self._padded_in(group.partition),
            ),
        )

    def _fused_options(self) -> dict[str, Any]:
        """The app config's ``fused`` section, with ``hydra.sweeper.compile`` where that section does not set it."""
        fused = _plain_dict(self.config.get("fused") if self.config is not None else None)
        if self.settings.compile and "compile" not in fused:
            fused["compile"] = self.settings.compile
        return fused

    def _seed(self, trial_id: int) -> int:
        """The trial's seed: the config's ``seed`` (default 0), or one of its own where ``seed: null``."""
        return trial_seed(self._config_seed(), self.settings.seed, trial_id)

    def _config_seed(self) -> int | None:
        config_seed = self.config.get(SEED_KEY, 0) if self.config is not None else 0
        return config_seed if isinstance(config_seed, int) else None

    def _search_spec(self, group: TrialGroup) -> GroupSpec:
        sched = self.settings.scheduler
        early_stopping = EarlyStoppingSpec(
            name=sched.name,
            metric=self.settings.metric,
            mode=self.settings.mode,
            reduction_factor=sched.reduction_factor,
            grace_period=sched.grace_period,
            max_t=sched.max_t,
            options=dict(sched.options),
            storage=self.rung_storage,  # one rung store per sweep: every decision ranks the whole sweep
            namespace=self.rung_namespace,
        )
        search: dict[str, Any] = {}
        if self.channel is not None and group.group_id in self.state.quotas:
            search = search_section(
                self.channel,
                quota=self.state.quotas[group.group_id],
                group=group,
                fusible=self.fusible,
                space=self.space,
                seeds=(self._config_seed(), self.settings.seed),
            )
        spec = self._spec(group, self._trial_overrides(self._trials_of(group), group.partition))
        return dataclasses.replace(spec, early_stopping=early_stopping, search=search)

    def _job_overrides(self, group: TrialGroup, extra: Sequence[str] = ()) -> list[str]:
        """A job's overrides: the fixed ones, its partition's values, ``extra`` (wins), Hydra's settings."""
        replaced = {override_key(line) for line in extra}
        shared = [
            *self.space.fixed,
            *self.space.override_lines(dict(group.partition), [k for k, _ in group.partition]),
        ]
        kept = [line for line in shared if override_key(line) not in replaced]
        return [*kept, *extra, *group_launch_overrides(group.group_id)]

    def _plan_devices(self) -> DevicePlan | None:
        """Refuse a launcher that cannot run the jobs' Trainers; deal GPUs to jobs on this machine (launch_rules.py)."""
        assert self.config is not None
        launcher = self.config.hydra.launcher
        kind = launcher_kind(str(launcher.get("_target_", "")))
        placement = TrainerPlacement.from_config(_trainer_placement(self.config))
        gpus = visible_gpus()
        plan = plan_devices(
            kind,
            placement,
            gpus,
            devices_per_group=self.settings.devices_per_group,
            groups_per_device=self.settings.groups_per_device,
        )
        processes = len(plan.blocks[0]) if plan is not None else placement.processes(len(gpus))
        tasks_per_node = launcher.get("tasks_per_node")
        check_launch(kind, placement, gpus=len(gpus), processes=processes, tasks_per_node=tasks_per_node)
        if plan is not None:
            log.info(
                "lightning_hydro: %d GPU(s) in %d block(s) of %d, at most %d group job(s) per block at a time%s",
                len(gpus),
                len(plan.blocks),
                len(plan.blocks[0]),
                plan.groups_per_device,
                f" ({len(plan.idle)} GPU(s) idle: they make no whole block)" if plan.idle else "",
            )
        elif self.settings.devices_per_group is not None:
            where = "the cluster places them" if kind not in ("basic", "joblib", "submitit_local") else "no GPU is used"
            log.info("lightning_hydro: hydra.sweeper.devices_per_group is not applied: %s", where)
        return plan

    def _run_relaunched(self, job: RelaunchedJob) -> list[dict[str, Any]]:
        """Run the one group job whose DDP rank Lightning re-launched this process for (see rank_relaunch.py)."""
        assert self.launcher is not None
        log.info("lightning_hydro: a further DDP rank of group %s: running that group's job only", job.group_id)
        (ret,) = self.launcher.launch([job.overrides], initial_job_idx=0)
        _ = ret.return_value  # a failed rank fails this process, so that Lightning ends the group's other ranks
        return []

    def _launch(self, jobs: Sequence[tuple[GroupSpec, list[str]]]) -> None:
        """Launch the groups (the first job of a sweep alone, then batches of what the GPUs allow); record failures."""
        if not jobs:
            return
        if self.launcher is None:  # pragma: no cover - sweep() checked it
            raise RuntimeError("LightningHydroSweeperImpl: call setup() first.")
        if not self._launched_before and len(jobs) > 1:
            # The first job of a sweep goes alone: a task function that cannot produce group results fails
            # there, before the other jobs train.
            self._launched_before = True
            self._launch(jobs[:1])
            first = self.failures.get(jobs[0][0].group_id)
            if first is not None and not is_width_refusal(first):
                raise RuntimeError(
                    f"lightning_hydro sweeper: the sweep's first job failed, so no other job was launched "
                    f"({jobs[0][0].group_id}: {_one_line(first)}). Its traceback is in the log above and in "
                    f"{self.state.sweep_dir / jobs[0][0].group_id / ERROR_FILE}. Fix the cause, then re-run the "
                    "same command (same hydra.sweep.dir)."
                ) from first
            jobs = jobs[1:]
        self._launched_before = True
        for batch in self.devices.batches(jobs) if self.devices is not None else [list(jobs)]:
            self._launch_batch(batch)

    def _launch_batch(self, jobs: Sequence[tuple[GroupSpec, list[str]]]) -> None:
        """Write each group's spec (with its launch overrides) and launch the groups together."""
        assert self.launcher is not None
        if self.devices is not None:  # a block of GPUs per job, round-robin
            blocks = self.devices.assign(len(jobs))
            jobs = [(spec, [*overrides, device_env_override(b)]) for (spec, overrides), b in zip(jobs, blocks)]
        for spec, overrides in jobs:
            launched = dataclasses.replace(spec, launch=tuple(overrides))  # a re-launched DDP rank replays them
            write_json_atomic(spec_path(self.state.sweep_dir, spec.group_id), launched.to_json())
        batch = [overrides for _, overrides in jobs]
        self.validate_batch_is_legal(batch)
        returns = self.launcher.launch(batch, initial_job_idx=self._job_idx)
        self._job_idx += len(batch)
        for (spec, _), ret in zip(jobs, returns):
            try:
                _ = ret.return_value  # raises the job's exception if it failed
            except Exception as err:
                self._log_failure(spec.group_id, err)
                self.failures[spec.group_id] = err
                continue
            if not (self.state.sweep_dir / spec.group_id / RESULT_FILE).is_file():
                self.failures[spec.group_id] = RuntimeError(
                    f"job {spec.group_id} returned without writing {RESULT_FILE}: its task function must "
                    "train the module that hydra.utils.instantiate(cfg.model) builds, or call "
                    "lightning_hydro.sweeper.fit_from_config(cfg), and every trial must finish "
                    "(an interrupted one is resumed by a rerun)"
                )

    def _log_failure(self, group_id: str, err: BaseException) -> None:
        """Log a failed job's traceback: the one the job wrote (any launcher), else the exception's own."""
        error_file = self.state.sweep_dir / group_id / ERROR_FILE
        if error_file.is_file():
            text = error_file.read_text(encoding="utf-8")
        else:
            text = "".join(traceback.format_exception(err))
        log.error("lightning_hydro: job %s failed: %s\n%s", group_id, _one_line(err), text)

    def _tell(self, group: TrialGroup) -> None:
        """Report the trials of a finished (or failed) group to the sampler, once each."""
        result = self.state.result(group)
        if result is None and group.group_id not in self.failures:
            return
        for tid in group.trial_ids:
            if tid in self._told:
                continue
            self._told.add(tid)
            record = self._record(group, tid)
            value = metric_value(record, self.settings.metric)
            if self.channel is not None:  # the job told it already, unless the job failed
                self.channel.tell(tid, record["status"], value)
                continue
            assert self.sampler is not None
            feedback = SamplerFeedback(record["status"], value, record["budget"])
            self.sampler.tell(tid, self.state.trials[tid].configuration, feedback)

    def _check_metric_logged(self, groups: Sequence[TrialGroup]) -> None:
        records = [self._record(g, tid) for g in groups for tid in g.trial_ids]
        logged = sorted({name for r in records for name in r["metrics"]})
        if logged and not any(self.settings.metric in r["metrics"] for r in records):
            raise ValueError(
                f"lightning_hydro sweeper: no trial logged the metric {self.settings.metric!r}; they logged "
                f"{logged}. Fix: set hydra.sweeper.metric to one of them and re-run the same command "
                "(finished groups are kept)."
            )

    # -- results ----------------------------------------------------------------------------------------

    def _record(self, group: TrialGroup, trial_id: int) -> dict[str, Any]:
        result = self.state.result(group)
        trial_result = (result or {}).get("trials", {}).get(str(trial_id))
        status = "failed" if group.group_id in self.failures else "pending"
        conf = self.state.trials[trial_id].configuration
        error = {"error": trial_result["error"]} if trial_result and "error" in trial_result else {}
        return {
            "trial_id": trial_id,
            "group": group.group_id,
            "job_dir": str(self.state.job_dir(group)),
            "params": dict(conf.values),
            "overrides": self.space.override_lines(conf.texts),
            "seed": trial_result.get("seed", self._seed(trial_id)) if trial_result else self._seed(trial_id),
            "status": trial_result["status"] if trial_result else status,
            "budget": trial_result["budget"] if trial_result else 0,
            "metrics": trial_result["metrics"] if trial_result else {},
            "history": trial_result.get("history", []) if trial_result else [],
            # what the group ran on (a user's own task function may not say)
            "backend": trial_result.get("backend", "") if trial_result else "",
            **error,  # a trial whose module could not be built: why
        }

    def _retrain(self) -> list[dict[str, Any]]:
        """Retrain the top-k trials as final jobs, with ``retrain.overrides`` winning over their values.

        HOOK (muP): a scaled search retrains at the full-size target; that adds the target's width
        overrides here, next to ``retrain.overrides``.
        """
        top_k, extra = self.settings.retrain.top_k, list(self.settings.retrain.overrides)
        if top_k == 0:
            return []
        records = [self._record(g, tid) for g in self.state.groups_of_kind("search") for tid in g.trial_ids]
        best = rank_trials(records, self.settings.metric, self.settings.mode)[:top_k]
        known = {g.group_id: g for g in self.state.groups_of_kind("retrain")}
        groups = []
        for record in best:
            source = next(g for g in self.state.groups if g.group_id == record["group"])
            group = known.get(f"retrain_{record['trial_id']:04d}") or TrialGroup(
                f"retrain_{record['trial_id']:04d}", "retrain", (record["trial_id"],), 1, source.partition
            )
            if group.group_id not in known:
                self.state.add([], [group])
            groups.append(group)
        dropped = [override_key(line) for line in extra]
        todo = [g for g in groups if self.state.result(g) is None]
        self._launch(
            [
                (
                    self._spec(g, self._trial_overrides(self._trials_of(g), g.partition, drop=dropped)),
                    self._job_overrides(g, extra),
                )
                for g in todo
            ]
        )
        return [{**self._record(g, g.trial_ids[0]), "retrain_overrides": extra} for g in groups]

    def _report(self, records: list[dict[str, Any]], retrained: list[dict[str, Any]]) -> None:
        metric, mode = self.settings.metric, self.settings.mode
        json_path, csv_path = write_results(self.state.sweep_dir, records, retrained, metric=metric, mode=mode)
        log_keys = {d.key for d in self.space.dimensions if isinstance(d, Interval) and d.log}
        plots = "off (hydra.sweeper.plots=false)"
        if self.settings.plots:  # drawn by a process of their own: the sweep does not wait for matplotlib
            plot_in_background(json_path, self.state.sweep_dir / "plots", log_scale_keys=log_keys)
            plots = f"drawn in the background into {self.state.sweep_dir / 'plots'}"
        log.info("%s", format_best_table(records, metric, mode))
        if retrained:
            log.info(
                "%s",
                format_best_table(retrained, metric, mode, top=len(retrained)).replace("Best", "Retrained: best"),
            )
        log.info("lightning_hydro: results in %s, %s; plots %s", json_path, csv_path, plots)


def _trainer_placement(config: DictConfig) -> dict[str, Any]:
    """The app config's ``trainer.accelerator``, ``devices`` and ``strategy`` (unset ones left out)."""
    found: dict[str, Any] = {}
    for key in ("accelerator", "devices", "strategy"):
        node = OmegaConf.select(config, f"{TRAINER_KEY}.{key}", default=None)
        found[key] = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig | ListConfig) else node
    return {k: v for k, v in found.items() if v is not None}


def _plain_dict(node: Any) -> dict[str, Any]:
    if node is None:
        return {}
    container = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    return {str(k): v for k, v in container.items()} if isinstance(container, dict) else {}


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: " + " ".join(str(err).split())
