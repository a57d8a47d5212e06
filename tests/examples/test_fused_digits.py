import importlib.util
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_example_with_compile_trains_as_without_and_prints_how_many_steps_ran_compiled(capsys):
    spec = importlib.util.spec_from_file_location("fused_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = ["--trials", "3", "--epochs", "2", "--hidden-dim", "16", "--backend", "vmap"]
    eager = module.main(args)
    capsys.readouterr()
    compiled = module.main([*args, "--compile", "on"])
    out = capsys.readouterr().out
    # 2 epochs of 23 batches: the first step runs split (it verifies the fusion), and the first short last batch
    # (a new graph); the second short batch runs whole
    said = "compile=True: 44 training steps ran whole (forward, backward and update as one compiled function); 3 "
    assert said in out
    for tid in eager:
        assert compiled[tid]["metrics"]["val_acc"] == pytest.approx(eager[tid]["metrics"]["val_acc"], abs=0.01)
