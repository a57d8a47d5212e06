"""The Hydra plugin: discovery, and real sweeps of examples/train.py run in this process (basic launcher)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper

import hydra_plugins
from hydra_plugins.lightning_hydro_sweeper.lightning_hydro_sweeper import LightningHydroSweeper
from tests.helpers import wait_for_file

from .conftest import REPO, TINY, TRAIN, KeptSweep, read_results, run_sweep

INSTALLED_LAUNCHERS = {  # launcher plugins this environment may have installed (the [dev] extra has the first two)
    "hydra_plugins.hydra_joblib_launcher": "JoblibLauncher",
    "hydra_plugins.hydra_submitit_launcher": "LocalLauncher",
    "hydra_plugins.hydra_ray_launcher": "RayLauncher",
}


def test_hydra_discovers_the_sweeper_next_to_installed_plugins():
    paths = [str(p) for p in hydra_plugins.__path__]
    assert str(REPO / "hydra_plugins") in paths
    sweepers = {f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Sweeper)}
    assert f"{LightningHydroSweeper.__module__}.LightningHydroSweeper" in sweepers
    launchers = {c.__name__ for c in Plugins.instance().discover(Launcher)}
    assert "BasicLauncher" in launchers  # Hydra's own
    # plugins installed beside ours share the namespace package and are discovered with it; an environment
    # without any (no [dev] extra) has only ours
    installed = {name for module, name in INSTALLED_LAUNCHERS.items() if importlib.util.find_spec(module) is not None}
    assert installed <= launchers
    if installed:
        assert len(paths) >= 2
    node = ConfigStore.instance().load("hydra/sweeper/lightning_hydro.yaml").node
    assert node._target_ == "hydra_plugins.lightning_hydro_sweeper.lightning_hydro_sweeper.LightningHydroSweeper"
    assert node.fusion_limit == 16


def test_the_shim_imports_nothing_heavy():
    import subprocess
    import sys

    code = (
        "import sys; import hydra_plugins.lightning_hydro_sweeper.config, "
        "hydra_plugins.lightning_hydro_sweeper.lightning_hydro_sweeper; "
        "print(sorted(m for m in ('torch', 'lightning', 'lightning_hydro', 'optuna') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


SWEEP = [
    *TINY,
    "hydra.sweeper.n_trials=4",
    "hydra.sweeper.fusion_limit=2",
    "data.batch_size=choice(32, 64)",
    "hydra.sweeper.retrain.top_k=1",
    "hydra.sweeper.retrain.overrides=[trainer.max_epochs\\=2]",
]


def test_a_small_sweep_writes_complete_results_and_resumes_without_retraining(tmp_path):
    records = run_sweep(tmp_path, SWEEP)
    assert [r["trial_id"] for r in records] == [0, 1, 2, 3]
    results = read_results(tmp_path)
    assert [t["trial_id"] for t in results["trials"]] == [0, 1, 2, 3]
    plan = json.loads((tmp_path / "lightning_hydro" / "plan.json").read_text())
    groups = {g["group_id"]: g for g in plan["groups"]}
    for trial in results["trials"]:
        assert trial["status"] == "completed"
        assert trial["budget"] == 1
        assert set(trial["metrics"]) >= {"val_acc", "val_loss", "train_loss"}
        assert [h["epoch"] for h in trial["history"]] == [0]
        assert set(trial["params"]) == {"model.lr", "model.momentum", "data.batch_size"}
        assert f"data.batch_size={trial['params']['data.batch_size']}" in trial["overrides"]
        group = groups[trial["group"]]
        assert trial["trial_id"] in group["trial_ids"]
        assert group["partition"] == [["data.batch_size", str(trial["params"]["data.batch_size"])]]
        fused_dir = tmp_path / trial["group"] / "fused_0"  # the group's trials trained as one fused model
        assert trial["job_dir"] == str(tmp_path / trial["group"])
        assert trial["backend"] in ("vmap", "hfta", "loop")  # what the group's backend="auto" chose
        assert (fused_dir / "checkpoints" / "last.ckpt").is_file()
        metrics_csv = (fused_dir / "logs" / "version_0" / "metrics.csv").read_text()
        assert f"val_acc/trial_{trial['trial_id']}" in metrics_csv.splitlines()[0]
    assert all(len(g["trial_ids"]) <= 2 for g in plan["groups"] if g["kind"] == "search")
    # The job's own config is an ordinary config of the app: the partition's value, no trial values.
    job_overrides = (tmp_path / results["trials"][0]["group"] / ".hydra" / "overrides.yaml").read_text()
    assert "data.batch_size=" in job_overrides
    assert "model.lr" not in job_overrides
    assert results["best"]["trial_id"] == max(results["trials"], key=lambda t: t["metrics"]["val_acc"])["trial_id"]
    (retrained,) = results["retrain"]
    assert retrained["trial_id"] == results["best"]["trial_id"]
    assert retrained["budget"] == 2
    assert retrained["group"] == f"retrain_{retrained['trial_id']:04d}"
    header = (tmp_path / "results.csv").read_text().splitlines()[0]
    assert header.startswith("trial_id,group,backend,status,budget,model.lr,model.momentum,data.batch_size,")
    # drawn by a background process that the sweep does not wait for
    assert wait_for_file(tmp_path / "plots" / "learning_curves.png")
    assert wait_for_file(tmp_path / "plots" / "metric_vs_params.png")

    # The same command again: every group finished, so nothing is retrained and the results are identical.
    finished = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/group_result.json")}
    assert len(finished) == len(groups)
    run_sweep(tmp_path, SWEEP)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/group_result.json")} == finished
    assert read_results(tmp_path)["trials"] == results["trials"]


def test_tpe_asks_and_learns_round_by_round(tmp_path):
    pytest.importorskip("optuna")
    run_sweep(
        tmp_path,
        [*TINY, "hydra.sweeper.sampler=tpe", "hydra.sweeper.n_trials=4", "hydra.sweeper.round_size=2"],
    )
    plan = json.loads((tmp_path / "lightning_hydro" / "plan.json").read_text())
    assert len(plan["trials"]) == 4
    assert sorted(i for g in plan["groups"] for i in g["trial_ids"]) == [0, 1, 2, 3]
    # Two rounds of two trials: trials 2 and 3 were asked after 0 and 1 had finished.
    assert all(set(g["trial_ids"]) <= {0, 1} or set(g["trial_ids"]) <= {2, 3} for g in plan["groups"])
    assert len(read_results(tmp_path)["trials"]) == 4


def test_grid_from_the_command_line(tmp_path):
    run_sweep(
        tmp_path,
        [
            *TINY,
            "hydra.sweeper.sampler=grid",
            "hydra.sweeper.params=null",
            "model.lr=0.1,0.2",
            "model.momentum=choice(0.9)",
        ],
    )
    results = read_results(tmp_path)
    assert sorted((t["params"]["model.lr"], t["params"]["model.momentum"]) for t in results["trials"]) == [
        (0.1, 0.9),
        (0.2, 0.9),
    ]
    assert {t["group"] for t in results["trials"]} == {"group_0000"}  # one partition, fusion limit 16


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        (["hydra.sweeper.sampler=bayes"], ValueError, r"unknown sampler 'bayes'"),
        (["hydra.sweeper.scheduler.name=median"], ValueError, r"unknown scheduler 'median'"),
        (["hydra.sweeper.scheduler.reduction_factor=1"], ValueError, r"reduction_factor must be > 1"),
        (["hydra.sweeper.fusion_limit=0"], ValueError, r"fusion_limit must be >= 1"),
        (["hydra.sweeper.params=null"], ValueError, r"the search space is empty"),
        (["hydra.sweeper.params={model.lr:'interval(1e-3'}"], ValueError, r"cannot parse search space entry"),
        (
            ["hydra.sweeper.non_fusible=[data.batchsize]", "hydra.sweeper.params=null", "model.lr=0.1,0.2"],
            ValueError,
            r"non-fusible key 'data.batchsize' is not in the config \(did you mean 'data.batch_size'",
        ),
        (
            ["hydra.sweeper.non_fusible=[]"],
            ValueError,
            r"'data.batch_size' is searched but not declared non-fusible",
        ),
        (
            ["hydra.sweeper.sampler=grid"],
            ValueError,
            r"sampler 'grid' needs discrete values, but 'model.lr' is a continuous interval",
        ),
    ],
)
def test_errors_come_before_any_job_starts(tmp_path, overrides, error, match):
    with pytest.raises(error, match=match):
        run_sweep(tmp_path, [*TINY, "hydra.sweeper.n_trials=2", *overrides])
    assert not list(tmp_path.glob("group_*"))
    assert not (tmp_path / "lightning_hydro").exists()


def test_a_failed_job_is_reported_and_the_others_are_kept(tmp_path):
    # DigitsDataModule rejects batch_size=0: that partition's job fails, the other one trains.
    overrides = [*TINY, "hydra.sweeper.sampler=grid", "hydra.sweeper.params=null", "data.batch_size=32,0"]
    with pytest.raises(
        RuntimeError,
        match=r"1 job\(s\) failed \(group_\d+: InstantiationException: .*"
        r"DigitsDataModule: batch_size must be >= 1, got 0.*\)\. "
        r"Their trials are marked 'failed' in results.json\. Fix the cause, then re-run the same command",
    ):
        run_sweep(tmp_path, overrides)
    trials = read_results(tmp_path)["trials"]
    assert {(t["params"]["data.batch_size"], t["status"]) for t in trials} == {
        (32, "completed"),
        (0, "failed"),
    }


def test_a_metric_the_trials_do_not_log_is_reported_as_the_sweepers_setting(tmp_path):
    """The early stopping the sweeper adds monitors hydra.sweeper.metric: its error names that setting."""
    overrides = [*TINY, "hydra.sweeper.n_trials=2", "hydra.sweeper.scheduler.name=asha"]
    overrides.append("hydra.sweeper.metric=val_accu")
    with pytest.raises(
        RuntimeError,
        match=r"1 job\(s\) failed \(group_0000: SweepMetricNotLogged: lightning_hydro sweeper: "
        r"hydra\.sweeper\.metric='val_accu' is not logged by the trials of group group_0000 \(after the sanity check "
        r"and the first training batch\); they log 'train_loss', 'val_acc', 'val_loss'\. Fix: set "
        r"hydra\.sweeper\.metric to one of them \(the name the module gives self\.log, without '/trial_\{id\}'\) and "
        r"re-run the same command",
    ):
        run_sweep(tmp_path, overrides)
    written = (tmp_path / "group_0000" / "job_error.txt").read_text()
    assert "SweepMetricNotLogged: lightning_hydro sweeper: hydra.sweeper.metric='val_accu'" in written


def test_a_task_that_skips_fit_from_config_is_reported(tmp_path):
    sweep = KeptSweep()
    sweep.calling_file, sweep.calling_module = str(TRAIN), None
    sweep.task_function = lambda cfg: 0.5
    sweep.config_path, sweep.config_name = "../conf", "train"
    sweep.overrides, sweep.temp_dir = [*TINY, "hydra.sweeper.n_trials=1"], str(tmp_path)
    with pytest.raises(
        RuntimeError,
        match=r"group_0000: the task function returned without training the group's trials, so no "
        r"group_result.json was written.*Fix: build your module with hydra.utils.instantiate\(cfg.model\) and "
        r"pass it to trainer.fit.*or return lightning_hydro.sweeper.fit_from_config\(cfg\)",
    ):
        sweep.__enter__()


def test_auto_fusion_limit_probes_each_partition_once(tmp_path, monkeypatch):
    import sys

    from lightning_hydro.sweeper.planning.fusion_limit import FusionProbe

    job = sys.modules["lightning_hydro.sweeper.job.fit_from_config"]

    probed = []

    def fake_probe(build_module, trial_ids, **kwargs):
        probed.append((list(trial_ids), kwargs["safety_margin"], kwargs["max_limit"]))
        assert build_module(trial_ids[0]).hparams.hidden_dim == 8
        return 2, FusionProbe((1e6, 1.5e6), (0.01, 0.012), 1e9)

    monkeypatch.setattr(job, "measure_fusion_limit", fake_probe)
    run_sweep(
        tmp_path,
        [
            *TINY,
            "hydra.sweeper.n_trials=3",
            "hydra.sweeper.fusion_limit=auto",
            "hydra.sweeper.params=null",
            "model.lr=interval(0.01, 0.1)",
        ],
    )
    plan = json.loads((tmp_path / "lightning_hydro" / "plan.json").read_text())
    assert probed == [([0, 1], 0.2, 64)]
    assert plan["fusion_limits"] == {"all": 2}
    assert [len(g["trial_ids"]) for g in plan["groups"]] == [2, 1]
    assert len(read_results(tmp_path)["trials"]) == 3


def test_auto_fusion_limit_is_measured_by_a_probe_job(tmp_path):
    run_sweep(
        tmp_path,
        [
            *TINY,
            "hydra.sweeper.n_trials=3",
            "hydra.sweeper.fusion_limit=auto",
            "hydra.sweeper.probe.max_limit=2",
            "hydra.sweeper.params=null",
            "model.lr=0.1,0.2,0.3",
        ],
    )
    plan = json.loads((tmp_path / "lightning_hydro" / "plan.json").read_text())
    assert plan["fusion_limits"] == {"all": 2}  # measured, then capped by max_limit
    assert [len(g["trial_ids"]) for g in plan["groups"]] == [2, 1]
    assert len(read_results(tmp_path)["trials"]) == 3


def test_a_relative_sweep_dir_works_when_jobs_change_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_sweep(Path("sweep"), [*TINY, "hydra.job.chdir=true", "hydra.sweeper.n_trials=1"])
    trials = read_results(tmp_path / "sweep")["trials"]
    assert [t["status"] for t in trials] == ["completed"]
    assert trials[0]["job_dir"].startswith(str(tmp_path / "sweep"))


def test_a_scaled_search_tunes_surrogates_and_retrains_the_full_size_target(tmp_path):
    run_sweep(
        tmp_path,
        [
            *TINY,
            "model.hidden_dim=16",
            "+scaling.width=[hidden_dim]",
            "+scaling.ratio=4",
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.params=null",
            "model.lr=0.1,0.3",
            "hydra.sweeper.retrain.top_k=1",
        ],
    )
    results = read_results(tmp_path)
    assert len(results["trials"]) == 2
    (retrained,) = results["retrain"]
    # the search trained width-4 surrogates (16 / 4), the retrain the width-16 target with the best lr
    group_dir = tmp_path / results["trials"][0]["group"] / "fused_0"
    ckpt = torch.load(group_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["state_dict"]["stacked.head__weight"].shape == (2, 10, 4)
    retrain_dir = tmp_path / retrained["group"] / "fused_0"
    target = torch.load(retrain_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert target["state_dict"]["stacked.head__weight"].shape == (1, 10, 16)
    assert target["lightning_hydro"]["specs"][retrained["trial_id"]]["width_scaling"]["ratio"] == 1


def test_an_asha_sweep_stops_trials_and_refills_their_slots(tmp_path):
    run_sweep(
        tmp_path,
        [
            *TINY,
            "hydra.sweeper.scheduler.name=asha",
            "trainer.max_epochs=3",
            "hydra.sweeper.n_trials=5",
            "hydra.sweeper.fusion_limit=3",
            "hydra.sweeper.params=null",
            "model.lr=0.001,0.3,0.002,0.2,0.0005",
            "hydra.sweeper.sampler=grid",
        ],
    )
    plan = json.loads((tmp_path / "lightning_hydro" / "plan.json").read_text())
    assert [len(g["trial_ids"]) for g in plan["groups"]] == [5]  # one job: 3 slots, 2 trials wait for a slot
    trials = read_results(tmp_path)["trials"]
    assert sorted(t["trial_id"] for t in trials) == [0, 1, 2, 3, 4]
    assert {t["status"] for t in trials} <= {"completed", "stopped"}
    assert any(t["status"] == "stopped" for t in trials)
    assert sum(t["budget"] for t in trials) < 5 * 3  # less than every trial trained to the end
