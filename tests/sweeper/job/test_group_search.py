"""The sweep-wide search on the job side: one rung store for every group, new trials from the sweep's sampler."""

import json
import multiprocessing
import pickle

import lightning as L
import optuna
import pytest

from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from lightning_hydro.stopping.rung_record import RungEntry
from lightning_hydro.stopping.sqlite_rung_store import SqliteRungStore
from lightning_hydro.sweeper.group_spec import EarlyStoppingSpec
from lightning_hydro.sweeper.job.fit_trials import FusedSettings, fit_trials
from lightning_hydro.sweeper.job.group_search import ASKED_FILE, ForwardingRungStore, GroupSearch, sweep_trial
from lightning_hydro.sweeper.job.trainer_factory import ConfigTrainerFactory
from lightning_hydro.sweeper.planning.study_channel import STUDY_NAME, ChannelSpec, StudyChannel
from lightning_hydro.sweeper.planning.sweep_search import partition_quotas, sweep_name

TRAINER = {
    "max_epochs": 3,
    "limit_train_batches": 2,
    "limit_val_batches": 2,
    "log_every_n_steps": 1,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "enable_checkpointing": False,
    "logger": False,
}
SPACE = ("model.lr=tag(log, interval(1e-3, 1))", "data.batch_size=32,64")


def channel_spec(tmp_path, sampler="tpe"):
    return ChannelSpec(storage=str(tmp_path / "sampler.journal"), sampler=sampler, seed=0, mode="max", space=SPACE)


def asha(storage=None):
    return EarlyStoppingSpec(
        name="asha", metric="val_acc", mode="max", reduction_factor=3, grace_period=1, storage=storage
    )


def fit_group(workdir, lrs, stopping, *, batches=2):
    def build(trial_id):
        L.seed_everything(trial_id, verbose=False)
        return DigitsMLP(hidden_dim=16, lr=lrs[trial_id])

    return fit_trials(
        build,
        list(lrs),
        slots=len(lrs),
        datamodule=DigitsDataModule(batch_size=32),
        trainer_factory=ConfigTrainerFactory({**TRAINER, "limit_train_batches": batches}, None),
        workdir=workdir,
        early_stopping=stopping,
        fused=FusedSettings(backend="vmap"),
    )


def test_sweep_trial_ids_in_the_store():
    assert sweep_trial("sweep/12") == 12
    assert sweep_trial(7) == 7
    assert sweep_trial("job3/1") is None
    assert sweep_trial(True) is None


def test_partition_quotas_share_the_rest_in_proportion():
    assert partition_quotas({"a": 5, "b": 6, "c": 5}, 32) == {"a": 10, "b": 12, "c": 10}
    assert partition_quotas({"a": 3, "b": 1}, 4) == {"a": 3, "b": 1}
    assert sum(partition_quotas({"a": 7, "b": 2, "c": 1}, 33).values()) == 33
    with pytest.raises(ValueError, match="total=3 is below the 4 trials already asked"):
        partition_quotas({"a": 4}, 3)


def test_a_later_group_is_ranked_against_the_whole_sweep(tmp_path):
    """Group B's trials are all worse at rung 1 than group A's: the sweep-wide store stops every one of them,
    while ranked only among themselves (each group's own store) the best of B would go on."""
    good = {0: 0.1, 1: 0.2, 2: 0.3}  # learn in an epoch of 30 batches
    bad = {3: 0.0, 4: 0.0, 5: 0.0}  # learn nothing: chance accuracy
    store = str(tmp_path / "rungs.db")
    first = fit_group(tmp_path / "a", good, asha(store), batches=30)
    assert min(r["history"][0]["val_acc"] for r in first.values()) > 0.3  # chance: 0.1
    shared = fit_group(tmp_path / "b", bad, asha(store))
    alone = fit_group(tmp_path / "c", bad, asha(None))
    assert sorted(r["budget"] for r in shared.values()) == [1, 1, 1]
    assert max(r["budget"] for r in alone.values()) == 3  # alone, its best (ties: all of them) go on
    keys = {r.trial_id for r in SqliteRungStore(store, namespace="sweep").records(milestone=1)}
    assert keys == {f"sweep/{tid}" for tid in [*good, *bad]}


@pytest.mark.parametrize("seed", [2**32 - 1, 3_000_000_000, -5])
def test_any_sweep_seed_seeds_the_sampler(seed, tmp_path):
    # a config with seed: null gets a drawn seed; numpy (under Optuna's TPE) takes only 0 .. 2**32 - 1
    spec = ChannelSpec(storage=str(tmp_path / "s.journal"), sampler="tpe", seed=seed, mode="max", space=SPACE)
    assert [tid for tid, _ in StudyChannel(spec).ask(2)] == [0, 1]


def test_freed_slots_ask_the_sweeps_sampler_up_to_the_quota(tmp_path):
    channel = StudyChannel(channel_spec(tmp_path))
    planned = channel.ask(2, fixed={"data.batch_size": "32"})
    lrs = {tid: conf.values["model.lr"] for tid, conf in planned}
    asked_lrs = {}

    def build(trial_id):
        if trial_id not in lrs:
            lines = search.overrides(trial_id)
            asked_lrs[trial_id] = float(lines[0].split("=")[1])
            return DigitsMLP(hidden_dim=8, lr=asked_lrs[trial_id])
        return DigitsMLP(hidden_dim=8, lr=lrs[trial_id])

    search = GroupSearch(
        channel=channel,
        quota=5,
        planned=2,
        partition={"data.batch_size": "32"},
        fusible=("model.lr",),
        prefixes={},
        seeds=(0, 0),
        job_dir=tmp_path,
    )
    results = fit_trials(
        build,
        list(lrs),
        slots=2,
        datamodule=DigitsDataModule(batch_size=32),
        trainer_factory=ConfigTrainerFactory(TRAINER, None),
        workdir=tmp_path,
        early_stopping=asha(str(tmp_path / "rungs.db")),
        fused=FusedSettings(backend="vmap"),
        search=search,
    )
    assert sorted(results) == [0, 1, 2, 3, 4]  # 2 planned + 3 asked: the quota
    assert sorted(asked_lrs) == [2, 3, 4]
    assert [t for t, _ in json.loads((tmp_path / ASKED_FILE).read_text())["asked"]] == [2, 3, 4]
    study = optuna.load_study(study_name=STUDY_NAME, storage=channel._storage)
    trials = study.get_trials()
    assert [t.params["data.batch_size"] for t in trials] == ["32"] * 5  # every asked trial is of the partition
    for trial in trials:  # told as each ended, with every rung value it recorded
        result = results[trial.number]
        assert trial.state.name == {"completed": "COMPLETE", "stopped": "PRUNED"}[result["status"]]
        assert sorted(trial.intermediate_values) == [m for m in (1, 3) if m <= result["budget"]]
        assert trial.intermediate_values[1] == pytest.approx(result["history"][0]["val_acc"])
    # A rerun of the job draws the same trials again instead of asking new ones.
    draw = search.refill([], build)
    assert [draw(i)[0] for i in range(3)] == [2, 3, 4]
    assert draw(3) is None
    assert len(study.get_trials()) == 5


def _ask_in_process(spec_json, queue):
    channel = StudyChannel(ChannelSpec.from_json(spec_json))
    queue.put([tid for tid, _ in channel.ask(4)])


@pytest.mark.slow  # two spawned processes import the test module (torch, Lightning)
def test_trial_ids_are_unique_across_processes(tmp_path):
    spec = channel_spec(tmp_path)
    StudyChannel(spec)  # creates the study
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    workers = [ctx.Process(target=_ask_in_process, args=(spec.to_json(), queue)) for _ in range(2)]
    for worker in workers:
        worker.start()
    ids = queue.get(timeout=120) + queue.get(timeout=120)
    for worker in workers:
        worker.join(timeout=60)
    assert sorted(ids) == list(range(8))


def test_the_channel_pickles_without_its_storage(tmp_path):
    channel = StudyChannel(channel_spec(tmp_path))
    channel.ask(1)
    again = pickle.loads(pickle.dumps(channel))
    assert again.spec == channel.spec
    assert list(again.configurations()) == [0]


def test_forwarding_store_reports_new_values_once(tmp_path):
    channel = StudyChannel(channel_spec(tmp_path))
    ((tid, _),) = channel.ask(1)
    store = ForwardingRungStore(SqliteRungStore(tmp_path / "r.db", namespace="sweep"), channel)
    entry = RungEntry(f"sweep/{tid}", bracket=0, milestone=1, budget=1, value=0.25)
    assert store.append([entry]).inserted == (True,)
    assert store.append([entry]).inserted == (False,)
    store.append([RungEntry("other/1", bracket=0, milestone=1, budget=1, value=0.5)])  # not a sweep trial
    study = optuna.load_study(study_name=STUDY_NAME, storage=channel._storage)
    assert study.get_trials()[0].intermediate_values == {1: 0.25}
    assert [r.trial_id for r in store.records()] == [f"sweep/{tid}", "other/1"]
    assert store.state_dict()["kind"] == "sqlite"


def test_an_optuna_sampler_by_its_import_path(tmp_path):
    channel = StudyChannel(channel_spec(tmp_path, sampler="optuna.samplers.RandomSampler"))
    assert [tid for tid, _ in channel.ask(2)] == [0, 1]
    with pytest.raises(ValueError, match=r"'optuna\.samplers\.Nope' names no importable class"):
        StudyChannel(channel_spec(tmp_path, sampler="optuna.samplers.Nope"))
    with pytest.raises(ValueError, match=r"'json\.JSONDecoder' is not an Optuna sampler class"):
        StudyChannel(channel_spec(tmp_path, sampler="json.JSONDecoder"))


def test_sweeps_sharing_a_database_get_names_of_their_own(tmp_path):
    url = "postgresql://user@host/sweeps"
    assert sweep_name(tmp_path / "a", None) == "sweep"  # files of its own: no need
    assert sweep_name(tmp_path / "a", url) != sweep_name(tmp_path / "b", url)
    assert sweep_name(tmp_path / "a", url) == sweep_name(tmp_path / "a", url)  # the same on resume
    spec = ChannelSpec(storage=str(tmp_path / "s.journal"), sampler="tpe", seed=0, mode="max", space=SPACE, study="x")
    assert ChannelSpec.from_json(spec.to_json()) == spec
