"""Every callback test runs in its own working directory.

A callback on an ordinary LightningModule without ``storage`` records into ``lightning_hydro_rungs.db`` in the
Trainer's ``default_root_dir``, the working directory by default: shared by every test run from the repository
root, one test's rung records would rank another's trials, and the file was left in the checkout.
"""

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def own_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
