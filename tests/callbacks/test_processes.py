"""Eight processes, each fitting one trial with a real Trainer, share ASHA's rung records through one SQLite file.

No record is lost, and every process's decisions equal those of one process replaying the store's records in
their arrival order.
"""

from __future__ import annotations

import multiprocessing
import traceback
from typing import Any

import pytest
import torch

from lightning_hydro.callbacks import ASHA
from lightning_hydro.stopping import AsyncSuccessiveHalving, HalvingConfig, open_store
from tests.callbacks.trials import fit, mlp

PROCESSES = 8
CONFIG = HalvingConfig("min", grace_period=1, reduction_factor=2, max_t=4)  # rungs at epochs 1, 2 and 4
LEARNING_RATES = (0.3, 0.0003, 0.1, 0.001, 0.2, 0.003, 0.05, 0.01)


def _one_trial(storage: str, worker: int, barrier: Any, results: Any) -> None:
    try:
        torch.set_num_threads(1)  # forked from a process that used torch's thread pool
        callback = ASHA(
            "val_loss", grace_period=1, reduction_factor=2, max_t=4, storage=storage, namespace="sweep", trial_id=worker
        )
        barrier.wait()  # start together: the processes report to the store at the same moments
        trainer = fit(mlp(LEARNING_RATES[worker], seed=worker), [callback], max_epochs=4)
        outcome = callback.endings[worker]
        results.put((worker, callback.status, outcome.rung, trainer.current_epoch, None))
    except BaseException:
        results.put((worker, None, None, None, traceback.format_exc()))


def test_eight_trainers_share_rung_records_and_decide_as_a_sequential_replay(tmp_path):
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs the fork start method")
    storage = str(tmp_path / "asha.db")
    context = multiprocessing.get_context("fork")
    barrier, queue = context.Barrier(PROCESSES), context.Queue()
    processes = [context.Process(target=_one_trial, args=(storage, w, barrier, queue)) for w in range(PROCESSES)]
    for process in processes:
        process.start()
    outcomes = [queue.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    errors = [error for *_, error in outcomes if error]
    assert not errors, errors[0]
    by_worker = {worker: (status, rung, epochs) for worker, status, rung, epochs, _ in outcomes}

    records = open_store(storage, namespace="sweep").records()
    # no record lost or doubled: a trial stopped at rung k recorded k + 1 values, a completed one all three
    expected = sum(3 if status == "completed" else rung + 1 for status, rung, _ in by_worker.values())
    seen = (by_worker, records)  # every failure below prints the outcomes and the records it judged
    assert len(records) == expected, seen
    assert len({(r.trial_id, r.milestone) for r in records}) == len(records), seen

    reference = AsyncSuccessiveHalving(CONFIG)  # one process, the same arrival order
    replayed: dict[int, tuple[str, int | None]] = {}
    for record in records:
        decision = reference.report(record.trial_id, record.budget, record.value)
        if decision.action != "continue":
            replayed[int(record.trial_id)] = (
                "completed" if decision.action == "complete" else "stopped",
                decision.rung,
            )
    assert replayed == {worker: (status, rung) for worker, (status, rung, _) in by_worker.items()}, seen
    stopped = [worker for worker, (status, _, _) in by_worker.items() if status == "stopped"]
    assert stopped, seen  # the rule really stopped some trials...
    for worker in stopped:  # ...and their fits ended right after the rung that stopped them
        assert by_worker[worker][2] == CONFIG.milestones[by_worker[worker][1]], seen
