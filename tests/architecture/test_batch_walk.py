"""A steady fused training batch walks through few files of fused/ and optim/, and Lightning meets only the module.

The walk is recorded with ``sys.setprofile`` from one batch's start to the next's, in a real ``Trainer`` fit of
two lightning-hydra-template-shaped trials on vmap (Adam: the fused update; ``gradient_clip_val``: clipping), and
lists the package's files whose code runs. ``docs/architecture.md`` ("A training batch's walk") lists them in order;
``python tests/architecture/test_batch_walk.py`` prints the walk.
"""

from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger

import lightning_hydro
from lightning_hydro import FusedLightningModule
from lightning_hydro.demos.template_mnist import DigitsMNISTDataModule, MNISTLitModule, SimpleDenseNet

PACKAGE = str(Path(lightning_hydro.__file__).parent) + "/"
LIGHTNING = str(Path(L.__file__).parent) + "/"

# The files of fused/ and optim/ a steady batch enters, in the order it first enters them (docs/architecture.md).
WALK = [
    "fused/module.py",
    "optim/group_optimizer.py",
    "fused/step/training_step.py",
    "fused/logging/metrics.py",
    "fused/step/row_health.py",
    "fused/step/fused_update.py",
    "fused/logging/publisher.py",
]
# and where a read-back of the rows' health is due: the trials' records are settled
READ_BACK = ["fused/roster.py", "fused/group/book.py"]


class WalkRecorder(L.Callback):
    """Records ``(file, caller)`` of every call into the package during training batch ``batch``.

    The caller is the nearest frame up the stack in our package (its file) or in Lightning (``"lightning"``), so
    that torch's decorators (``torch.no_grad``) in between do not count.
    """

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.calls: list[tuple[str, str]] = []

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(PACKAGE):
            return
        caller, back = "", frame.f_back
        while back is not None and not back.f_code.co_filename.startswith((PACKAGE, LIGHTNING)):
            back = back.f_back
        if back is not None:
            name = back.f_code.co_filename
            caller = name[len(PACKAGE) :] if name.startswith(PACKAGE) else "lightning"
        self.calls.append((frame.f_code.co_filename[len(PACKAGE) :], caller))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        if idx == self.batch:
            sys.setprofile(self._profile)
        elif idx == self.batch + 1:
            sys.setprofile(None)

    def files(self, *folders: str) -> list[str]:
        """The files under ``folders`` entered, in the order first entered."""
        return list(dict.fromkeys(f for f, _ in self.calls if f.startswith(folders)))


def record_walk(batch: int = 4) -> WalkRecorder:
    """The walk of training batch ``batch`` (4: the fifth optimizer step, where no read-back is due; 3 reads back)."""
    torch.manual_seed(0)
    trials = [
        MNISTLitModule(
            net=SimpleDenseNet(lin1_size=16, lin2_size=16, lin3_size=8),
            optimizer=functools.partial(torch.optim.Adam, lr=lr),
            scheduler=None,
        )
        for lr in (1e-3, 3e-3)
    ]
    recorder = WalkRecorder(batch=batch)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=batch + 2,
        limit_val_batches=0,
        gradient_clip_val=1.0,
        callbacks=[recorder],
        logger=CSVLogger(tempfile.mkdtemp()),
        log_every_n_steps=1,
        enable_progress_bar=True,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    # the accelerator's read-back schedule (optimizer steps 1, 2, 4, ..., then every 32), on this CPU
    fused = FusedLightningModule(trials, backend="vmap", summary=False, divergence_check_every=32)
    try:
        trainer.fit(fused, DigitsMNISTDataModule(batch_size=32))
    finally:
        sys.setprofile(None)
    return recorder


def test_a_steady_training_batch_walks_the_listed_files_and_lightning_meets_only_the_module():
    walk = record_walk()
    files = walk.files("fused/", "optim/")
    assert files == WALK, f"a steady batch now enters {files}; update docs/architecture.md's walk with this test"
    assert len(files) <= 7  # issue 25: a reader follows a batch through at most seven files
    # Lightning calls the module's hooks (and the group optimizer it was given); nothing of ours calls the module back
    assert {caller for f, caller in walk.calls if f == "fused/module.py"} - {"fused/module.py"} == {"lightning"}
    from_lightning = {f for f, caller in walk.calls if caller == "lightning" and f.startswith(("fused/", "optim/"))}
    assert from_lightning == {"fused/module.py", "optim/group_optimizer.py"}
    # what the steady step has no business with
    assert not walk.files("fused/lightning/", "fused/evaluation/", "fused/verify/", "callbacks/", "sweeper/")


def test_a_batch_that_reads_the_health_back_also_settles_the_records_and_nothing_else():
    files = record_walk(batch=3).files("fused/", "optim/")
    assert [f for f in files if f not in WALK] == READ_BACK
    assert set(WALK) <= set(files)


if __name__ == "__main__":
    recorder = record_walk(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
    for file in recorder.files(""):
        callers = sorted({c for f, c in recorder.calls if f == file and c != file})
        print(f"{file:45s} entered from {', '.join(callers)}")
