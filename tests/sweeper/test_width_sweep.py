"""Sweeps that search hidden widths: padded groups through Hydra, and the fallback when padding is refused.

The template-shaped project (its own ``src/train.py`` and ``SimpleDenseNet``, unchanged) searches its three
layer sizes beside lr, as lightning-hydra-template's ``mnist_optuna.yaml`` does.
"""

from __future__ import annotations

import torch

from .template_project import FEW_BATCHES, make_project, read_json, run_train

SEARCH = ["-m", "hparams_search=mnist_lightning_hydro", "logger=csv", "extras.print_config=false", *FEW_BATCHES]
WIDTHS = ["model.net.lin1_size", "model.net.lin2_size", "model.net.lin3_size"]
SMALL = [
    "hydra.sweeper.n_trials=4",
    "trainer.max_epochs=1",
    "hydra.sweeper.params=null",  # the search is the command line's: lr and widths, one batch size
    "model.optimizer.lr=interval(0.0001,0.2)",
    f"hydra.sweeper.non_fusible=[{','.join(WIDTHS)}]",
    "hydra.sweeper.plots=false",
    "hydra.sweeper.max_padding_overhead=3.0",
]


def _groups(sweep_dir):
    plan = read_json(sweep_dir / "lightning_hydro" / "plan.json")
    return [g for g in plan["groups"] if g["kind"] == "search"]


def test_a_template_search_over_layer_sizes_fuses_trials_of_different_widths(tmp_path, monkeypatch):
    project = make_project(tmp_path)
    # the template's save_hyperparameters(logger=False) keeps the network in each checkpoint: loading one imports src
    monkeypatch.syspath_prepend(str(project))
    sweep_dir = tmp_path / "sweep"
    sizes = [f"{key}=choice(16,32)" for key in WIDTHS]
    out = run_train(project, [*SEARCH, *SMALL, *sizes, f"hydra.sweep.dir={sweep_dir}"])
    assert out.returncode == 0, out.stdout[-6000:]

    trials = read_json(sweep_dir / "results.json")["trials"]
    assert sorted(t["trial_id"] for t in trials) == [0, 1, 2, 3]
    assert all(t["status"] == "completed" and "val/acc" in t["metrics"] for t in trials)
    by_id = {t["trial_id"]: t for t in trials}
    mixed = [
        g for g in _groups(sweep_dir) if len({tuple(by_id[t]["params"][k] for k in WIDTHS) for t in g["trial_ids"]}) > 1
    ]
    assert mixed, "no group fused trials of different widths"
    assert "pads the widths model.net.lin1_size, model.net.lin2_size, model.net.lin3_size" in out.stdout
    assert "padding overhead per group" in out.stdout
    assert "nothing fuses" not in out.stdout
    for group in mixed:
        for tid in group["trial_ids"]:
            # each trial's own checkpoint holds its weights at its own width
            ckpt = sweep_dir / group["group_id"] / "checkpoints" / f"trial_{tid}" / "epoch_000.ckpt"
            state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
            shapes = {k: tuple(v.shape) for k, v in state.items() if k.endswith("weight") and v.ndim == 2}
            lin1 = int(by_id[tid]["params"]["model.net.lin1_size"])
            lin3 = int(by_id[tid]["params"]["model.net.lin3_size"])
            assert shapes["net.model.0.weight"] == (lin1, 784)
            assert shapes["net.model.9.weight"] == (10, lin3)


def test_a_group_whose_padding_is_refused_is_split_into_identical_widths(tmp_path):
    project = make_project(tmp_path)
    sweep_dir = tmp_path / "sweep"
    search = [
        *SEARCH,
        *SMALL,
        "hydra.sweeper.sampler=grid",
        "hydra.sweeper.non_fusible=[model.net.output_size]",
        "model.net.output_size=choice(10,11)",  # a searched output size: padding it would change the loss
        "model.optimizer.lr=choice(0.01,0.02)",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    out = run_train(project, search)
    assert out.returncode == 0, out.stdout[-6000:]
    refusals = [line for line in out.stdout.splitlines() if "split into identical-width groups" in line]
    assert len(refusals) == 1, out.stdout[-6000:]
    assert "module 'net.model.9' (Linear" in refusals[0]
    trials = read_json(sweep_dir / "results.json")["trials"]
    assert sorted(t["trial_id"] for t in trials) == [0, 1, 2, 3]
    assert all(t["status"] == "completed" for t in trials)
    by_id = {t["trial_id"]: t for t in trials}
    groups = _groups(sweep_dir)
    assert sorted(len(g["trial_ids"]) for g in groups) == [2, 2]
    for group in groups:
        assert len({by_id[t]["params"]["model.net.output_size"] for t in group["trial_ids"]}) == 1
