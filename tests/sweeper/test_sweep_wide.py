"""One search across the whole sweep: a real sweep of examples/train.py with TPE and ASHA, in this process."""

import json

import optuna

from lightning_hydro.stopping import SqliteRungStore
from lightning_hydro.sweeper.job.group_search import ASKED_FILE
from lightning_hydro.sweeper.planning.study_channel import STUDY_NAME

from .conftest import TINY, read_results, run_sweep

SWEEP = [
    *TINY,
    "trainer.max_epochs=3",
    "hydra.sweeper.sampler=tpe",
    "hydra.sweeper.n_trials=10",
    "hydra.sweeper.fusion_limit=3",
    "hydra.sweeper.scheduler.name=asha",
    "data.batch_size=choice(32, 64)",
    "hydra.sweeper.plots=false",
]


def test_groups_ask_the_sweeps_sampler_and_share_one_rung_store(tmp_path):
    run_sweep(tmp_path, SWEEP)
    results = read_results(tmp_path)
    ids = sorted(t["trial_id"] for t in results["trials"])
    assert ids == list(range(10))  # n_trials configurations, with sweep-wide unique ids
    plan = json.loads((tmp_path / "lightning_hydro" / "plan.json").read_text())
    groups = [g for g in plan["groups"] if g["kind"] == "search"]
    assert len(groups) == len({tuple(map(tuple, g["partition"])) for g in groups})  # one group per partition
    assert sum(plan["quotas"].values()) == 10
    asked = [tid for g in groups for tid, _ in json.loads((tmp_path / g["group_id"] / ASKED_FILE).read_text())["asked"]]
    assert len(asked) == 10 - 3  # the sweeper asked the first round (the fusion limit); the jobs the rest
    for group in groups:
        assert group["slots"] <= 3
        assert len(group["trial_ids"]) == plan["quotas"][group["group_id"]]
    # every trial's rung values in one store, under sweep-wide ids
    records = SqliteRungStore(tmp_path / "lightning_hydro" / "rungs.db", namespace="sweep").records(milestone=1)
    assert sorted(r.trial_id for r in records) == sorted(f"sweep/{tid}" for tid in ids)
    # the sampler was told every rung value and how every trial ended
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "lightning_hydro" / "sampler.journal"))
    )
    study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    by_id = {t["trial_id"]: t for t in results["trials"]}
    for trial in study.get_trials():
        record = by_id[trial.number]
        assert trial.state.name == {"completed": "COMPLETE", "stopped": "PRUNED"}[record["status"]]
        assert trial.intermediate_values[1] == record["history"][0]["val_acc"]
        assert record["params"]["model.lr"] == trial.params["model.lr"]
        assert f"data.batch_size={trial.params['data.batch_size']}" in record["overrides"]
    assert not (tmp_path / "plots").exists()  # hydra.sweeper.plots=false

    # Resumed (the same command again): nothing is retrained, nothing asked.
    finished = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/group_result.json")}
    run_sweep(tmp_path, SWEEP)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/group_result.json")} == finished
    assert read_results(tmp_path)["trials"] == results["trials"]
    assert len(study.get_trials()) == 10


def test_a_deadline_sweep_is_one_search_too(tmp_path):
    """``deadline`` refills like ``asha``: its freed slots ask the sweep's sampler (it used to ask per group)."""
    sweep = [arg for arg in SWEEP if "scheduler.name" not in arg]
    run_sweep(
        tmp_path, [*sweep, "hydra.sweeper.scheduler.name=deadline", "+hydra.sweeper.scheduler.options.deadline=600"]
    )
    assert sorted(t["trial_id"] for t in read_results(tmp_path)["trials"]) == list(range(10))
    plan = json.loads((tmp_path / "lightning_hydro" / "plan.json").read_text())
    groups = [g for g in plan["groups"] if g["kind"] == "search"]
    asked = [tid for g in groups for tid, _ in json.loads((tmp_path / g["group_id"] / ASKED_FILE).read_text())["asked"]]
    assert len(asked) == 10 - 3  # the sweeper asked the first round; the jobs asked the rest as slots freed
    assert sum(plan["quotas"].values()) == 10
