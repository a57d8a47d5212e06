"""Resume after a SIGKILL: a real `examples/train.py -m` process is killed mid-group, then rerun."""

import os
import signal
import time
from pathlib import Path

from .conftest import TINY, read_results, train_subprocess

HERE = Path(__file__).resolve().parent


def test_a_killed_sweep_resumes_without_redoing_finished_groups(tmp_path):
    sweep_dir, armed, paused = tmp_path / "sweep", tmp_path / "armed", tmp_path / "paused"
    armed.touch()
    # Two partitions (batch size 32: trial 0; 64: trial 1), run one after the other by the basic
    # launcher. The pause callback freezes group_0001 at the start of its trial's 2nd epoch.
    args = [
        "-m",
        *TINY,
        "trainer.max_epochs=2",
        f"hydra.sweep.dir={sweep_dir}",
        "hydra.sweeper.sampler=grid",
        "hydra.sweeper.params=null",
        "data.batch_size=32,64",
        "+callbacks.pause._target_=pause_callback.PauseInGroup",
        "+callbacks.pause.group=group_0001",
        f"+callbacks.pause.armed_file={armed}",
        f"+callbacks.pause.paused_file={paused}",
    ]
    first = train_subprocess(args, extra_path=HERE, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not paused.exists():
            assert first.poll() is None, first.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the sweep never reached the pause"
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert first.returncode == -signal.SIGKILL
    done_first = sweep_dir / "group_0000" / "group_result.json"
    interrupted = sweep_dir / "group_0001" / "fused_0"  # the group's first (and only) fused round
    assert done_first.is_file()
    assert (interrupted / "checkpoints" / "last.ckpt").is_file()
    assert not (interrupted / "group_fit.json").exists()
    assert not (sweep_dir / "group_0001" / "group_result.json").exists()
    assert not (sweep_dir / "results.json").exists()
    finished_at = done_first.stat().st_mtime_ns

    armed.unlink()
    second = train_subprocess(args, extra_path=HERE)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out[-3000:]
    launched = [line for line in out.splitlines() if "LIGHTNING_HYDRO_GROUP=" in line]
    assert len(launched) == 1
    assert "LIGHTNING_HYDRO_GROUP=group_0001" in launched[0]
    assert done_first.stat().st_mtime_ns == finished_at
    job_log = (sweep_dir / "group_0001" / "train.log").read_text()
    assert f"trials [1]: resuming from {interrupted / 'checkpoints' / 'last.ckpt'}" in job_log

    trials = read_results(sweep_dir)["trials"]
    assert sorted(t["trial_id"] for t in trials) == [0, 1]
    assert all(t["status"] == "completed" and t["budget"] == 2 for t in trials)
    resumed = next(t for t in trials if t["trial_id"] == 1)
    assert [row["epoch"] for row in resumed["history"]] == [0, 1]
