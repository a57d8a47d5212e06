"""A template-shaped architecture search with ASHA: trials of different widths padded into groups vs groups of one.

The search of lightning-hydra-template's ``mnist_optuna.yaml``, at this machine's scale: the template's
``MNISTLitModule`` (our demo of its published structure, unchanged) with ``SimpleDenseNet`` layer sizes
``lin1_size``, ``lin2_size``, ``lin3_size`` each drawn from {32, 64, 128, 256} and an Adam learning rate
drawn log-uniformly from [1e-4, 1e-2] (``--trials`` of them, seeded), a fixed batch size of 128, on the
digits at MNIST's shape. Both arms use ASHA (grace period 1 epoch, reduction factor 3, ``--max-epochs``)
with one rung store per arm shared by all its runs:

- ``separate``: every trial alone, one ``Trainer.fit`` each (groups of one: what a search whose widths
  cannot fuse does today);
- ``padded``: trials grouped by :func:`~lightning_hydro.sweeper.planning.width_groups.group_by_padded_cost`
  (padding overhead at most ``--max-overhead``, at most ``--group-size`` trials), each group one
  ``FusedLightningModule(pad_widths=True)`` fit.

The arms alternate for ``--repeats`` rounds in one process (the first round of each warms up nothing
separately: each arm is timed whole); reported: median wall time, trial-epochs trained, best ``val/acc``
(the template's ``val/acc_best`` of the best trial), and each padded group's overhead.

    python benchmarks/width_padding.py                       # 32 trials, 9 epochs, 1 repeat
    python benchmarks/width_padding.py --repeats 3 --max-overhead 1.0
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends import make_backend
from lightning_hydro.callbacks import ASHA
from lightning_hydro.demos.template_mnist import (
    IMAGE_SIDE,
    DigitsMNISTDataModule,
    MNISTLitModule,
    SimpleDenseNet,
)
from lightning_hydro.stacking import StackedState
from lightning_hydro.stacking.padding import padding_mask
from lightning_hydro.sweeper.planning.width_groups import group_by_padded_cost

SIZES = (32, 64, 128, 256)
KEYS = ("lin1_size", "lin2_size", "lin3_size")


def sample(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{**{k: rng.choice(SIZES) for k in KEYS}, "lr": 10 ** rng.uniform(-4, -2), "seed": i} for i in range(n)]


def dense_net_cost(widths: dict[str, int]) -> float:
    """Weights of SimpleDenseNet at these sizes (784 inputs, 10 outputs)."""
    sizes = [IMAGE_SIDE * IMAGE_SIDE, *(widths[k] for k in KEYS), 10]
    return float(sum(a * b for a, b in itertools.pairwise(sizes)))


class TensorLoggingLitModule(MNISTLitModule):
    """The template module, but its steps log plain tensors instead of updating torchmetrics objects.

    Written when torchmetrics calls could not run under vmap (the template module then trained on the loop); this
    variant (``--model tensors``) shows the vmap backend with padded widths and no metric objects at all.
    """

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss, _preds, _targets = self.model_step(batch)
        self.log("train/loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        loss, preds, targets = self.model_step(batch)
        self.log("val/loss", loss, on_step=False, on_epoch=True)
        self.log("val/acc", (preds == targets).float().mean(), on_step=False, on_epoch=True)

    def on_validation_epoch_end(self) -> None:
        pass  # val/acc_best: the best val/acc the benchmark saw (from the trial's history)


MODEL = {"template": MNISTLitModule, "tensors": TensorLoggingLitModule}
MODEL_NAME = "template"


def build(config: dict[str, Any]) -> MNISTLitModule:
    torch.manual_seed(config["seed"])
    return MODEL[MODEL_NAME](
        net=SimpleDenseNet(**{k: config[k] for k in KEYS}),
        optimizer=functools.partial(torch.optim.Adam, lr=config["lr"]),
        scheduler=None,
    )


def trainer(max_epochs: int, store: str, **kwargs: Any) -> tuple[L.Trainer, ASHA]:
    asha = ASHA(
        monitor="val/acc", mode="max", grace_period=1, reduction_factor=3, max_t=max_epochs, storage=store, **kwargs
    )
    return (
        L.Trainer(
            max_epochs=max_epochs,
            callbacks=[asha],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            accelerator="cpu",
        ),
        asha,
    )


def run_separate(configs: list[dict[str, Any]], max_epochs: int, store: str) -> dict[str, Any]:
    epochs, best = 0, 0.0
    start = time.perf_counter()
    for i, config in enumerate(configs):
        fit, _ = trainer(max_epochs, store, trial_id=i)
        torch.manual_seed(1234)
        fit.fit(build(config), datamodule=DigitsMNISTDataModule(batch_size=128))
        epochs += fit.current_epoch
        best = max(best, float(fit.callback_metrics.get("val/acc_best", fit.callback_metrics["val/acc"])))
    return {
        "seconds": time.perf_counter() - start,
        "trial_epochs": epochs,
        "best_val_acc": best,
        "groups": len(configs),
    }


def run_padded(
    configs: list[dict[str, Any]], max_epochs: int, store: str, max_overhead: float, group_size: int
) -> dict[str, Any]:
    widths = {i: {k: c[k] for k in KEYS} for i, c in enumerate(configs)}
    groups = group_by_padded_cost(widths, max_overhead=max_overhead, max_size=group_size, cost=dense_net_cost)
    epochs, best, backends = 0, 0.0, set()
    start = time.perf_counter()
    for group in groups:
        fused = FusedLightningModule(
            [build(configs[i]) for i in group.trial_ids],
            trial_ids=list(group.trial_ids),
            pad_widths=True,
            summary=False,
        )
        fit, _ = trainer(max_epochs, store)
        torch.manual_seed(1234)
        fit.fit(fused, datamodule=DigitsMNISTDataModule(batch_size=128))
        for record in fused.results.values():
            backends.add(str(record["backend"]))
            epochs += int(record["epochs"])
            best = max(best, float(record["metrics"].get("val/acc_best", record["metrics"]["val/acc"])))
    return {
        "seconds": time.perf_counter() - start,
        "trial_epochs": epochs,
        "best_val_acc": best,
        "groups": len(groups),
        "overheads": [round(g.overhead, 2) for g in groups],
        "sizes": [len(g.trial_ids) for g in groups],
        "backends": sorted(b or "none" for b in backends),
    }


def mask_cost(configs: list[dict[str, Any]], group_size: int, repeats: int = 20) -> dict[str, float]:
    """Median seconds of one padded vmap forward+backward of a group vs the 0/1 mask guard over its tensors.

    The padded group does not need the guard (each trial's optimizer steps only its own width); this says what
    it would cost an update over whole stacked tensors (params and gradients masked once per step).
    """
    modules = [TensorLoggingLitModule(**{**build(c).hparams, "net": build(c).net}) for c in configs[:group_size]]
    group = StackedState(torch.nn.Module(), modules, list(range(len(modules))), pad_widths=True)
    backend = make_backend("vmap", group)
    batch = (torch.rand(128, 1, IMAGE_SIDE, IMAGE_SIDE), torch.randint(0, 10, (128,)))
    # the masks are built once per group (and again when its trials change), then each step multiplies by them
    masks = {
        name: padding_mask([group.true_shapes[r][name] for r in range(group.size)], p.shape[1:], like=p)
        for name, p in group.params.items()
    }

    def step() -> None:
        loss = backend.run("training_step", batch, 0).loss()
        assert loss is not None
        loss.sum().backward()

    def guard() -> None:
        with torch.no_grad():
            for name, param in group.params.items():
                param.mul_(masks[name])
                assert param.grad is not None
                param.grad.mul_(masks[name])

    times: dict[str, list[float]] = {"step": [], "mask": []}
    step()
    for _ in range(repeats):
        for name, fn in (("step", step), ("mask", guard)):
            begin = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - begin)
    return {"size": float(group.size), **{name: statistics.median(values) for name, values in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--max-epochs", type=int, default=9)
    parser.add_argument("--max-overhead", type=float, default=0.5)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", choices=sorted(MODEL), default="template")
    args = parser.parse_args()
    global MODEL_NAME
    MODEL_NAME = args.model
    torch.set_num_threads(1)
    configs = sample(args.trials, args.seed)
    cost = mask_cost(configs, args.group_size)
    print(
        f"mask guard over a padded group of {cost['size']:.0f}: {cost['mask'] * 1e3:.2f} ms vs a vmap forward+backward "
        f"{cost['step'] * 1e3:.2f} ms ({cost['mask'] / cost['step']:.1%}; medians of 20)",
        flush=True,
    )
    results: dict[str, list[dict[str, Any]]] = {"separate": [], "padded": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for arm in ("padded", "separate") if repeat % 2 else ("separate", "padded"):
                store = f"sqlite:///{tmp}/{arm}_{repeat}.db"
                if arm == "separate":
                    results[arm].append(run_separate(configs, args.max_epochs, store))
                else:
                    results[arm].append(run_padded(configs, args.max_epochs, store, args.max_overhead, args.group_size))
                print(f"repeat {repeat} {arm}: {results[arm][-1]}", flush=True)
    print(
        f"\n{args.trials} trials, ASHA(grace 1, eta 3, max_t {args.max_epochs}), padding overhead <= "
        f"{args.max_overhead}, groups of <= {args.group_size}; medians of {args.repeats}:"
    )
    print(f"{'arm':10} {'wall s':>8} {'trial-epochs':>13} {'best val/acc':>13} {'groups':>7}")
    for arm, runs in results.items():
        print(
            f"{arm:10} {statistics.median(r['seconds'] for r in runs):8.1f} "
            f"{statistics.median(r['trial_epochs'] for r in runs):13.0f} "
            f"{statistics.median(r['best_val_acc'] for r in runs):13.3f} {runs[0]['groups']:7d}"
        )
    ratio = statistics.median(r["seconds"] for r in results["separate"]) / statistics.median(
        r["seconds"] for r in results["padded"]
    )
    print(f"separate / padded wall time: {ratio:.2f}x" if math.isfinite(ratio) else "")


if __name__ == "__main__":
    main()
