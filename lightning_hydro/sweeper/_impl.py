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

This class runs the sweep in that order; each step's work lives in ``sweeper/planning/``: the settings
(``settings.py``), the groups (``grouping.py``), what each job is told (``job_specs.py``, the contract in
``sweeper/group_spec.py``), launching (``group_launcher.py``, ``launch_rules.py``), the plan (``sweep_state.py``)
and the results (``reports.py``, ``plots.py``). The jobs run the user's task function through
``sweeper/job/group_task.py``.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from lightning_hydro.sweeper.app_config import check_sweep_keys
from lightning_hydro.sweeper.group_spec import RESULT_FILE, STATE_DIR
from lightning_hydro.sweeper.job.group_task import GroupTask
from lightning_hydro.sweeper.job.rank_relaunch import RelaunchedJob, relaunched_job
from lightning_hydro.sweeper.planning.group_launcher import GroupLauncher, Job, one_line
from lightning_hydro.sweeper.planning.grouping import GroupPlanner, is_width_refusal, split_refused
from lightning_hydro.sweeper.planning.job_specs import JobSpecs
from lightning_hydro.sweeper.planning.launch_rules import plan_sweep_devices
from lightning_hydro.sweeper.planning.plots import plot_in_background
from lightning_hydro.sweeper.planning.reports import format_best_table, metric_value, rank_trials, write_results
from lightning_hydro.sweeper.planning.samplers import GridSampler, Sampler, SamplerFeedback, TPESampler, make_sampler
from lightning_hydro.sweeper.planning.search_space import Interval, override_key, parse_search_space
from lightning_hydro.sweeper.planning.settings import SweepSettings
from lightning_hydro.sweeper.planning.study_channel import STUDY_NAME, ChannelSpec, StudyChannel
from lightning_hydro.sweeper.planning.sweep_search import absorb_asked_trials, rung_storage, sampler_storage, sweep_name
from lightning_hydro.sweeper.planning.sweep_state import SweepState
from lightning_hydro.sweeper.planning.trial_groups import Partition, Trial, TrialGroup, partition_label, partition_of

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

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep the context and create the configured launcher."""
        self.config = config
        self.hydra_context = hydra_context
        # The jobs run the user's task function through GroupTask: it points the job's model node at the
        # group's fused trials and reports failures with their traceback (see job/group_task.py).
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
        devices = plan_sweep_devices(
            self.config,
            devices_per_group=self.settings.devices_per_group,
            groups_per_device=self.settings.groups_per_device,
        )
        lines = [*self.settings.params, *arguments]
        self.space = parse_search_space(lines)
        swept = {dim.key: dim.prefix for dim in self.space.dimensions}
        check_sweep_keys(self.config, swept, self.settings.non_fusible)
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
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        self.state = SweepState.open(sweep_dir, self.settings.request(lines))
        self.planner = GroupPlanner(self.settings, self.state, self.space.keys, continuous=self.channel is not None)
        self.specs = JobSpecs(
            self.settings,
            self.space,
            self.config,
            self.state,
            rung_storage=rung_storage(sweep_dir, self.settings.storage),
            rung_namespace=sweep_name(sweep_dir, self.settings.storage),
            channel=self.channel,
        )
        self.jobs = GroupLauncher(
            self.launcher,
            sweep_dir,
            devices,
            self.validate_batch_is_legal,
            launched_before=any(self.state.result(g) is not None for g in self.state.groups),
        )
        self.failures = self.jobs.failures
        self._told: set[int] = set()

        self._search()
        retrained = self._retrain()
        records = [self._record(g, tid) for g in self.state.groups_of_kind("search") for tid in g.trial_ids]
        self._report(records, retrained)
        if self.failures:
            failed = "; ".join(f"{gid}: {one_line(err)}" for gid, err in self.failures.items())
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
            self.jobs.launch([(self.specs.search_spec(g), self.specs.job_overrides(g)) for g in pending])
            pending = [self._absorb(group) for group in self._split_refused(pending)]
            for group in pending:
                self._tell(group)
            self._check_metric_logged(pending)

    def _plan_round(self, n_new: int) -> list[TrialGroup]:
        """Ask the sampler for ``n_new`` trials and plan their groups (grouping.py; probes first for ``auto``)."""
        if self.channel is not None:  # the sweep's sampler numbers its trials itself
            trials = [Trial(tid, conf) for tid, conf in self.channel.ask(n_new)]
        else:
            assert self.sampler is not None
            first_id = len(self.state.trials)
            ids = list(range(first_id, first_id + n_new))
            trials = [Trial(tid, conf) for tid, conf in zip(ids, self.sampler.ask(ids))]
        self.planner.choose_widths(trials)
        if self.settings.fusion_limit == "auto":
            self._probe_fusion_limits(trials)
        return self.planner.plan(trials, n_target=self._n_target())

    def _split_refused(self, groups: list[TrialGroup]) -> list[TrialGroup]:
        """Replace each group whose width padding was refused by identical-width groups, to launch next."""
        kept = []
        for group in groups:
            err = self.failures.get(group.group_id)
            widths = self.specs.padded_in(group.partition)
            if err is None or not is_width_refusal(err) or not widths:
                kept.append(group)
                continue
            del self.failures[group.group_id]
            self.state.groups.remove(group)
            self.state.add([], split_refused(group, self.specs.trials_of(group), widths))
            log.warning("lightning_hydro: %s split into identical-width groups: %s", group.group_id, one_line(err))
        return kept

    def _absorb(self, group: TrialGroup) -> TrialGroup:
        """The group, with the trials its job asked of the sweep's sampler added to it and to the plan."""
        return group if self.channel is None else absorb_asked_trials(self.state, group, self.channel)

    def _n_target(self) -> int:
        if isinstance(self.sampler, GridSampler):
            return self.sampler.max_trials
        assert self.settings.n_trials is not None  # SweepSettings.from_config refuses none but for grid
        return self.settings.n_trials

    def _round_size(self, n_target: int) -> int:
        if self.settings.round_size is not None:
            return self.settings.round_size
        if isinstance(self.sampler, TPESampler) or self.channel is not None:
            limit = self.settings.fusion_limit
            return limit if isinstance(limit, int) else _DEFAULT_TPE_ROUND
        return n_target

    def _probe_fusion_limits(self, trials: list[Trial]) -> None:
        """Launch one probe job per partition whose limit is unknown; record each measured limit."""
        by_partition: dict[Partition, list[Trial]] = {}
        for trial in trials:
            partition = partition_of(trial.configuration, self.planner.splitting_keys())
            if self.state.fusion_limit(partition) is None:
                by_partition.setdefault(partition, []).append(trial)
        jobs: list[Job] = []
        probes = []
        for i, (partition, members) in enumerate(by_partition.items()):
            ids = tuple(t.trial_id for t in members[:2])
            group = TrialGroup(f"probe_{len(self.state.fusion_limits) + i:04d}", "probe", ids, len(ids), partition)
            (self.state.job_dir(group) / RESULT_FILE).unlink(missing_ok=True)
            spec = self.specs.spec(group, self.specs.trial_overrides(members[:2], partition), members[:2])
            sharing = self.settings.groups_per_device if self.jobs.devices is not None else 1  # jobs on one GPU
            probe = {**dataclasses.asdict(self.settings.probe), "groups_per_device": sharing}
            spec = dataclasses.replace(spec, probe=probe)
            jobs.append((spec, self.specs.job_overrides(group)))
            probes.append(group)
        self.jobs.launch(jobs)
        for group in probes:
            result = self.state.result(group)
            if group.group_id in self.failures or result is None:
                cause = self.failures.get(group.group_id)
                raise RuntimeError(
                    "lightning_hydro sweeper: the fusion-limit probe of partition "
                    f"'{partition_label(group.partition)}' failed "
                    f"({one_line(cause) if cause else 'no result'}). Fix the cause, or set "
                    "hydra.sweeper.fusion_limit to a number."
                ) from cause
            self.state.set_fusion_limit(group.partition, int(result["fusion_limit"]))
            log.info(
                "lightning_hydro: fusion limit %d for [%s]",
                result["fusion_limit"],
                partition_label(group.partition),
            )

    def _run_relaunched(self, job: RelaunchedJob) -> list[dict[str, Any]]:
        """Run the one group job whose DDP rank Lightning re-launched this process for (see job/rank_relaunch.py)."""
        assert self.launcher is not None
        log.info("lightning_hydro: a further DDP rank of group %s: running that group's job only", job.group_id)
        (ret,) = self.launcher.launch([job.overrides], initial_job_idx=0)
        _ = ret.return_value  # a failed rank fails this process, so that Lightning ends the group's other ranks
        return []

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

    def _check_metric_logged(self, groups: list[TrialGroup]) -> None:
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
        seed = self.specs.seed(trial_id)
        return {
            "trial_id": trial_id,
            "group": group.group_id,
            "job_dir": str(self.state.job_dir(group)),
            "params": dict(conf.values),
            "overrides": self.space.override_lines(conf.texts),
            "seed": trial_result.get("seed", seed) if trial_result else seed,
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
        self.jobs.launch(
            [
                (
                    self.specs.spec(g, self.specs.trial_overrides(self.specs.trials_of(g), g.partition, drop=dropped)),
                    self.specs.job_overrides(g, extra),
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
