import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "fused_digits.py"


def test_example_runs_and_finds_a_good_learning_rate(capsys):
    # the example's Trainer uses accelerator="auto" (the GPU where there is one): the claims below hold on any device
    spec = importlib.util.spec_from_file_location("fused_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.main(["--trials", "6", "--epochs", "3", "--hidden-dim", "32", "--backend", "vmap"])
    out = capsys.readouterr().out
    assert "trial  status     epochs" in out
    assert "best trial:" in out
    assert len(results) == 6
    assert all(r["status"] == "completed" and r["budget"] == 3 for r in results.values())
    assert max(r["metrics"]["val_acc"] for r in results.values()) > 0.8
