"""Resume after a SIGKILL: a real `examples/train.py -m` process is killed at one of three moments, then rerun.

Moments: while the first group trains, between groups (the first finished, the second training), and while
the best trial is retrained after the search. Launchers: basic (groups one after the other) and joblib
(groups in parallel worker processes, killed with the sweep). Whatever was finished is not relaunched, the
interrupted group resumes from its checkpoint (no epoch trained twice), and nothing is lost.
"""

import os
import signal
import time
from pathlib import Path

import pytest

from .conftest import TINY, read_results, train_subprocess

HERE = Path(__file__).resolve().parent

# moment: (the group the pause callback freezes at the start of its 2nd epoch, extra overrides)
MOMENTS = {
    "in_first_group": ("group_0000", []),
    "between_groups": ("group_0001", []),
    "in_retrain": ("retrain_*", ["hydra.sweeper.retrain.top_k=1"]),
}


def finished_groups(sweep_dir: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_mtime_ns for p in sweep_dir.glob("*/group_result.json")}


@pytest.mark.parametrize(
    ("launcher", "moment"),
    [
        ("basic", "between_groups"),  # the fast case, in the default suite
        pytest.param("basic", "in_first_group", marks=pytest.mark.slow),
        pytest.param("basic", "in_retrain", marks=pytest.mark.slow),
        pytest.param("joblib", "in_first_group", marks=pytest.mark.slow),
        pytest.param("joblib", "between_groups", marks=pytest.mark.slow),
        pytest.param("joblib", "in_retrain", marks=pytest.mark.slow),
    ],
)
def test_a_killed_sweep_resumes_without_redoing_finished_groups(launcher, moment, tmp_path):
    if launcher == "joblib":
        pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_dir, armed, paused = tmp_path / "sweep", tmp_path / "armed", tmp_path / "paused"
    armed.touch()
    paused_group, extra = MOMENTS[moment]
    # Two partitions (batch size 32: trial 0; 64: trial 1), so two groups.
    args = [
        "-m",
        *TINY,
        "trainer.max_epochs=2",
        f"hydra.sweep.dir={sweep_dir}",
        "hydra.sweeper.sampler=grid",
        "hydra.sweeper.params=null",
        "data.batch_size=32,64",
        "+callbacks.pause._target_=pause_callback.PauseInGroup",
        f"+callbacks.pause.group={paused_group}",
        f"+callbacks.pause.armed_file={armed}",
        f"+callbacks.pause.paused_file={paused}",
        *extra,
        *(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"] if launcher == "joblib" else []),
    ]
    first = train_subprocess(args, extra_path=HERE, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        # between groups under joblib: also wait for the first group to finish (it runs beside the second)
        must_finish = sweep_dir / "group_0000" / "group_result.json" if moment == "between_groups" else None
        while not paused.exists() or (must_finish is not None and not must_finish.exists()):
            assert first.poll() is None, first.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the sweep never reached the pause"
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the sweep and its launcher's worker processes
        first.wait()
    assert first.returncode == -signal.SIGKILL
    (interrupted,) = [p.parent.parent for p in sweep_dir.glob(f"{paused_group}/fused_0/checkpoints/last.ckpt")]
    group_id = interrupted.parent.name
    assert group_id not in finished_groups(sweep_dir)
    assert not (interrupted / "group_fit.json").exists()
    assert not (sweep_dir / "results.json").exists()
    finished = finished_groups(sweep_dir)
    if moment != "in_first_group":
        assert {"group_0000", "group_0001"} - {group_id} <= set(finished)

    armed.unlink()
    second = train_subprocess(args, extra_path=HERE)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out[-3000:]
    launched = {line.split("LIGHTNING_HYDRO_GROUP=")[1].split()[0] for line in out.splitlines() if "GROUP=" in line}
    assert group_id in launched
    assert not launched & set(finished)  # finished groups are not relaunched ...
    assert {g: t for g, t in finished_groups(sweep_dir).items() if g in finished} == finished  # ... nor rewritten
    job_log = (interrupted.parent / "train.log").read_text()
    assert f"resuming from {interrupted / 'checkpoints' / 'last.ckpt'}" in job_log
    # not trained twice: the second attempt (log version_1) trains epoch 1 only
    rows = (interrupted / "logs" / "version_1" / "metrics.csv").read_text().splitlines()
    epoch = rows[0].split(",").index("epoch")
    assert {row.split(",")[epoch] for row in rows[1:]} - {""} == {"1"}  # (step rows have no epoch)

    results = read_results(sweep_dir)
    trials = results["trials"]
    assert sorted(t["trial_id"] for t in trials) == [0, 1]  # nothing lost, nothing twice
    for trial in [*trials, *results["retrain"]]:
        assert (trial["status"], trial["budget"]) == ("completed", 2)
        assert [row["epoch"] for row in trial["history"]] == [0, 1]
    assert len(results["retrain"]) == (1 if moment == "in_retrain" else 0)
