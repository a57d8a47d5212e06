import csv
import json

from lightning_hydro.sweeper.planning.plots import plot_sweep
from lightning_hydro.sweeper.planning.reports import format_best_table, metric_value, rank_trials, write_results


def record(tid, status, acc, lr, bs=32):
    history = [] if acc is None else [{"epoch": e, "val_acc": acc * (e + 1) / 2} for e in range(2)]
    return {
        "trial_id": tid,
        "group": "group_0000",
        "job_dir": "/x/group_0000",
        "params": {"model.lr": lr, "data.batch_size": bs},
        "overrides": [f"model.lr={lr}", f"data.batch_size={bs}"],
        "status": status,
        "budget": 2,
        "metrics": {} if acc is None else {"val_acc": acc, "val_loss": 1 - acc},
        "history": history,
        "backend": "vmap",
    }


RECORDS = [
    record(0, "completed", 0.8, 0.1),
    record(1, "stopped", 0.9, 0.01, 64),
    record(2, "diverged", float("nan"), 1.0),
    record(3, "failed", None, 0.5),
]


def test_ranking_skips_missing_and_non_finite_values():
    assert metric_value(RECORDS[2], "val_acc") is None
    assert [r["trial_id"] for r in rank_trials(RECORDS, "val_acc", "max")] == [1, 0]
    assert [r["trial_id"] for r in rank_trials(RECORDS, "val_loss", "min")] == [1, 0]


def test_results_files(tmp_path):
    json_path, csv_path = write_results(tmp_path, RECORDS, [], metric="val_acc", mode="max")
    data = json.loads(json_path.read_text())
    assert data["best"]["trial_id"] == 1
    assert [t["trial_id"] for t in data["trials"]] == [0, 1, 2, 3]
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["status"] for r in rows] == ["completed", "stopped", "diverged", "failed"]
    assert rows[1]["model.lr"] == "0.01"
    assert rows[1]["val_acc"] == "0.9"
    assert rows[0]["overrides"] == "model.lr=0.1 data.batch_size=32"
    assert [r["backend"] for r in rows] == ["vmap"] * 4
    assert data["trials"][0]["backend"] == "vmap"


def test_best_table_and_missing_metric_hint():
    table = format_best_table(RECORDS, "val_acc", "max", top=5)
    assert table.splitlines()[0] == "Best 2 of 4 trials by val_acc (max):"
    assert table.splitlines()[2].split() == ["1", "1", "stopped", "2", "0.9000", "0.01", "64"]
    assert "No trial logged a finite 'acc' (logged metrics: ['val_acc', 'val_loss'])" in format_best_table(
        RECORDS, "acc", "max"
    )


def test_the_best_table_of_a_sweep_whose_groups_all_failed_says_so():
    failed = [{**record, "status": "failed", "metrics": {}} for record in RECORDS]
    assert format_best_table(failed, "val_acc", "max") == (
        "No trial has a 'val_acc' to rank: no trial has results (4 failed; failed groups: see above)."
    )


def test_plots_are_written(tmp_path):
    paths = plot_sweep(RECORDS, "val_acc", tmp_path / "plots", log_scale_keys={"model.lr"})
    assert [p.name for p in paths] == ["learning_curves.png", "metric_vs_params.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
