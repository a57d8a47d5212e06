"""Eight real processes share one store: no record is lost and decisions equal a sequential replay."""

import multiprocessing
import os
import random
import traceback
import uuid
from pathlib import Path
from typing import Any

import pytest

from lightning_hydro.stopping import AsyncSuccessiveHalving, HalvingConfig, open_store

CONFIG = HalvingConfig("max", grace_period=1, reduction_factor=3, max_t=9)
PROCESSES = 8
TRIALS_PER_PROCESS = 3


def _value(trial: str, budget: int) -> float:
    return random.Random(f"{trial}/{budget}").random()


POSTGRES_URL = os.environ.get("LIGHTNING_HYDRO_TEST_POSTGRES_URL")
"""A PostgreSQL database to test against, if the machine has one (``postgresql://postgres@127.0.0.1/sweeps``)."""


def _train_trials(spec: str, namespace: str, worker: int, barrier: Any, results: Any) -> None:
    """One process: its trials reach rungs 1, 3, 9 in turn, reporting to the shared store."""
    try:
        asha = AsyncSuccessiveHalving(CONFIG, open_store(spec, namespace=namespace))
        alive = [f"w{worker}-t{index}" for index in range(TRIALS_PER_PROCESS)]
        decisions = []
        barrier.wait()  # start together: maximal contention
        for budget in CONFIG.milestones:
            for trial in list(alive):
                decision = asha.report(trial, budget, _value(trial, budget))
                decisions.append((trial, decision.milestone, decision.action))
                if decision.action != "continue":
                    alive.remove(trial)
        results.put((worker, decisions, None))
    except BaseException:
        results.put((worker, [], traceback.format_exc()))


def _run_processes(spec: str, namespace: str) -> dict[tuple[str, int], str]:
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(PROCESSES), context.Queue()
    processes = [
        context.Process(target=_train_trials, args=(spec, namespace, w, barrier, results)) for w in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    errors = [error for _, _, error in outcomes if error]
    assert not errors, errors[0]
    return {(trial, milestone): action for _, decisions, _ in outcomes for trial, milestone, action in decisions}


@pytest.mark.parametrize("kind", ["sqlite", "sqlalchemy", "postgresql"])
def test_eight_processes_lose_no_record_and_decide_as_a_sequential_replay(kind: str, tmp_path: Path) -> None:
    if kind != "sqlite":
        pytest.importorskip("sqlalchemy")
    if kind == "postgresql" and not POSTGRES_URL:
        pytest.skip("set LIGHTNING_HYDRO_TEST_POSTGRES_URL to a PostgreSQL database to run it")
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs the fork start method")
    spec = {
        "sqlite": str(tmp_path / "asha.db"),
        "sqlalchemy": f"sqlite+pysqlite:///{tmp_path / 'asha.db'}",
        "postgresql": str(POSTGRES_URL),
    }[kind]
    namespace = f"sweep-{uuid.uuid4().hex}"  # a server database outlives the test: a namespace of its own
    concurrent = _run_processes(spec, namespace)

    records = open_store(spec, namespace=namespace).records()
    assert len(records) == len(concurrent)  # every report made a record; none was lost or doubled
    assert {(r.trial_id, r.milestone) for r in records} == set(concurrent)
    assert len(concurrent) > PROCESSES * TRIALS_PER_PROCESS  # some trials went past the first rung

    reference = AsyncSuccessiveHalving(CONFIG)  # one process, the same arrival order
    replayed = {(str(r.trial_id), r.milestone): reference.report(r.trial_id, r.budget, r.value).action for r in records}
    assert replayed == concurrent
