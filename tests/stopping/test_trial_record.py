import ast
from pathlib import Path

import lightning_hydro.stopping.trial_record as trial_record
from lightning_hydro.stopping.trial_record import TrialRecord, best_trial, format_results_table


def test_round_trip_and_budget():
    record = TrialRecord(3, status="stopped", epochs=2, steps=40, metrics={"val_loss": 0.5}, reason="ASHA rung 0")
    data = record.as_dict()
    assert data["budget"] == 2
    assert TrialRecord.from_dict(3, data) == record


def test_best_ignores_missing_and_non_finite_values():
    records = {
        0: TrialRecord(0, metrics={"val_loss": float("nan")}),
        1: TrialRecord(1, metrics={"val_loss": 0.7}),
        2: TrialRecord(2, metrics={}),
        3: TrialRecord(3, metrics={"val_loss": 0.4}),
    }
    assert best_trial(records, "val_loss", "min") == 3
    assert best_trial(records, "val_loss", "max") == 1
    assert best_trial(records, "val_acc", "max") is None


def test_table_lists_validation_metrics_first():
    records = {0: TrialRecord(0, metrics={"train_loss": 1.0, "val_acc": 0.5, "lr": 0.1})}
    header = format_results_table(records).splitlines()[0].split()
    assert header == ["trial", "status", "epochs", "steps", "val_acc", "lr", "train_loss", "note"]


def test_the_record_module_imports_nothing_of_ours():
    """The per-trial record types are the floor every layer shares: pure Python, no module of this package."""
    tree = ast.parse(Path(trial_record.__file__ or "").read_text())
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert [name for name in imported if name and name.split(".")[0] == "lightning_hydro"] == []
