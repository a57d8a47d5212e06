"""Published LightningModules fuse unchanged and match separate runs (issue 11, items 4 and 5).

The modules: lightning-hydra-template's MNISTLitModule (our demo of its published structure), Lightning's own
``lightning.pytorch.demos`` (BoringModel, DemoModel, LightningTransformer), and an autoencoder written as
Lightning's published autoencoder example is (encoder/decoder Sequentials, MSE on flattened images, Adam).

Exactness is measured on first-step gradients, over all parameters at once: a per-tensor ratio, or weights
after one Adam step, is no test, since tensors whose true gradient is zero (Linear biases feeding
BatchNorm) carry only rounding noise, which Adam turns into lr-sized steps.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.demos import LightningTransformer
from lightning.pytorch.demos.boring_classes import BoringModel, DemoModel
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos.template_mnist import DigitsMNISTDataModule, MNISTLitModule, SimpleDenseNet
from tests.helpers import learned_state_difference, make_trainer

TOLERANCE = 1e-5  # ||g_fused - g_alone|| / ||g_alone|| over all parameters of a trial


class LitAutoEncoder(L.LightningModule):
    """Shaped like Lightning's published autoencoder example (encoder 28*28 -> 64 -> 3, decoder back, MSE)."""

    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 3))
        self.decoder = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 28 * 28))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, _ = batch
        x = x.view(x.size(0), -1)
        z = self.encoder(x)
        x_hat = self.decoder(z)
        loss = F.mse_loss(x_hat, x)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, _ = batch
        x = x.view(x.size(0), -1)
        self.log("val_loss", F.mse_loss(self.decoder(self.encoder(x)), x))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams["lr"])


def template_module(lr: float) -> MNISTLitModule:
    return MNISTLitModule(
        net=SimpleDenseNet(lin1_size=32, lin2_size=32, lin3_size=16),
        optimizer=functools.partial(torch.optim.Adam, lr=lr),
        scheduler=functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, mode="min", patience=2),
    )


class OfflineTransformer(LightningTransformer):
    """Lightning's demo transformer; only its WikiText2 download is skipped (the test brings token data)."""

    def prepare_data(self) -> None:
        pass


def tiny_transformer(lr: float) -> LightningTransformer:
    module = OfflineTransformer(vocab_size=33)
    for layer in module.modules():  # dropout off: the same masks cannot be drawn fused and alone
        if isinstance(layer, nn.Dropout):
            layer.p = 0.0
        elif isinstance(layer, nn.MultiheadAttention):
            layer.dropout = 0.0
    return module


def digits_loader(trainer: L.Trainer, module: L.LightningModule) -> None:
    trainer.fit(module, datamodule=DigitsMNISTDataModule(batch_size=64))


def token_loader(trainer: L.Trainer, module: L.LightningModule) -> None:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randint(0, 33, (16, 8), generator=g), torch.randint(0, 33, (16, 8), generator=g))
    trainer.fit(module, train_dataloaders=DataLoader(data, batch_size=4))


def boring_loader(trainer: L.Trainer, module: L.LightningModule) -> None:
    trainer.fit(module)


def demo_loader(trainer: L.Trainer, module: L.LightningModule) -> None:
    trainer.fit(module, train_dataloaders=DataLoader(torch.randn(64, 32), batch_size=8))


# (name, factory(lr), fit, backends): every module runs on every backend (the template's torchmetrics objects
# are replayed per trial under vmap and hfta: lightning_hydro/backends/deferred_metrics.py).
CASES = [
    ("template", template_module, digits_loader, ["loop", "vmap", "hfta"]),
    ("autoencoder", lambda lr: LitAutoEncoder(lr=lr), digits_loader, ["loop", "vmap", "hfta"]),
    ("boring", lambda lr: BoringModel(), boring_loader, ["loop", "vmap", "hfta"]),
    ("demo", lambda lr: DemoModel(learning_rate=lr), demo_loader, ["loop", "vmap", "hfta"]),
    ("transformer", tiny_transformer, token_loader, ["loop", "vmap", "hfta"]),
]


class _FirstGradients(L.Callback):
    """Records the gradients of the first optimizer step (after backward and clipping, before the step)."""

    def __init__(self) -> None:
        self.grads: dict[str, torch.Tensor] = {}

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if not self.grads:
            source = pl_module.stacked if isinstance(pl_module, FusedLightningModule) else pl_module
            self.grads = {n: p.grad.detach().clone() for n, p in source.named_parameters() if p.grad is not None}


def first_gradients(module: L.LightningModule, fit: Any) -> dict[str, torch.Tensor]:
    recorder = _FirstGradients()
    torch.manual_seed(1234)
    fit(make_trainer(max_steps=1, limit_val_batches=0, callbacks=[recorder]), module)
    return recorder.grads


def relative_gradient_error(fused: dict[str, torch.Tensor], row: int, alone: dict[str, torch.Tensor]) -> float:
    mine = torch.cat([fused[name.replace(".", "__")][row].flatten().double() for name in alone])
    theirs = torch.cat([g.flatten().double() for g in alone.values()])
    return float((mine - theirs).norm() / theirs.norm())


@pytest.mark.parametrize(
    ("name", "backend"), [(name, backend) for name, _, _, backends in CASES for backend in backends]
)
def test_first_step_gradients_of_published_modules_match_separate_runs(name: str, backend: str) -> None:
    _, factory, fit, _ = next(case for case in CASES if case[0] == name)
    trials = []
    for seed, lr in enumerate((1e-3, 1e-2)):
        torch.manual_seed(seed)
        trials.append(factory(lr))
    alone = [first_gradients(copy.deepcopy(m), fit) for m in trials]
    fused = first_gradients(
        FusedLightningModule([copy.deepcopy(m) for m in trials], backend=backend, summary=False), fit
    )
    errors = [relative_gradient_error(fused, row, grads) for row, grads in enumerate(alone)]
    print(f"first-step gradients, {name} on {backend}: relative errors {errors}")
    assert all(alone), "no gradients recorded"
    assert max(errors) <= TOLERANCE, (name, backend, errors)


@pytest.mark.parametrize(
    ("backend", "optimizer_path"),
    [("loop", "universal"), ("loop", "auto"), ("vmap", "universal"), ("hfta", "auto"), ("auto", "auto")],
)
def test_template_val_acc_after_two_epochs_is_within_two_validation_images(backend: str, optimizer_path: str) -> None:
    """The issue's measure: per-trial val/acc, fused vs separate, after 2 epochs (250 validation images).

    On the loop backend each trial's own torch optimizer (``"universal"``) is bitwise a separate run; the fused
    Adam update (``"auto"`` picks it for all-Adam groups) and the vmap/hfta kernels round differently. The
    template's validation accuracy magnifies rounding: its Linear biases feeding BatchNorm get a zero gradient,
    whose rounding noise Adam turns into lr-sized steps that the running means lag behind, so two separate runs
    whose batches are merely summed in another order differ by 5 to 23 of the 250 images (measured). Fused and
    separate runs share their arithmetic closely: every state entry that training moves agrees to 1e-5 (checked),
    and val/acc within 2 images, a tolerance that holds on this CPU (at most 1) and on the H100 host's CPU
    (2, with auto's choice there). The Trainers are pinned to the CPU (``accelerator="cpu"``). Under vmap and hfta
    the template's torchmetrics objects (``val/acc``, ``val/loss``, ``val/acc_best``) are replayed per trial.
    """
    trials = []
    for seed, lr in enumerate((1e-3, 3e-3, 1e-2)):
        torch.manual_seed(seed)
        trials.append(template_module(lr))

    def val_acc(module: L.LightningModule) -> dict[str, float]:
        trainer = make_trainer(max_epochs=2)
        torch.manual_seed(1234)
        trainer.fit(module, datamodule=DigitsMNISTDataModule(batch_size=128))
        return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/acc")}

    separate = [copy.deepcopy(m) for m in trials]
    alone = [val_acc(m)["val/acc"] for m in separate]
    fused = FusedLightningModule(
        [copy.deepcopy(m) for m in trials], backend=backend, optimizer_path=optimizer_path, summary=False
    )
    fused_metrics = val_acc(fused)
    images = [round(abs(fused_metrics[f"val/acc/trial_{tid}"] - acc) * 250, 3) for tid, acc in enumerate(alone)]
    states = [learned_state_difference(fused.unfuse(tid), own) for tid, own in enumerate(separate)]
    print(f"val/acc, fused ({fused.backend}, {optimizer_path}) vs separate, in images of 250:", images, states)
    exact = backend == "loop" and optimizer_path == "universal"
    assert max(states) <= (0.0 if exact else 1e-5), states
    assert max(images) <= (0.0 if exact else 2.0), images
    if backend != "loop":  # the best accuracy, tracked by each trial's own MaxMetric in on_validation_epoch_end
        assert all(
            fused_metrics[f"val/acc_best/trial_{tid}"] >= fused_metrics[f"val/acc/trial_{tid}"] for tid in range(3)
        )


class _OptimizerForms(L.LightningModule):
    """One MLP, with each way of building its optimizer that published modules use."""

    def __init__(self, form: str, lr: float, optimizer: Any = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Linear(28 * 28, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 10))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.body(x.flatten(1)), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", F.cross_entropy(self.body(x.flatten(1)), y))

    def configure_optimizers(self) -> Any:
        form, lr = self.hparams["form"], self.hparams["lr"]
        if form == "parameters":
            return torch.optim.SGD(self.parameters(), lr=lr, momentum=0.9)
        if form == "trainer_model":
            return torch.optim.AdamW(self.trainer.model.parameters(), lr=lr)
        if form == "decay_groups":  # no weight decay on biases and norms, selected by name
            decay = [p for n, p in self.named_parameters() if p.dim() > 1]
            other = [p for n, p in self.named_parameters() if p.dim() <= 1]
            groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
            return torch.optim.AdamW(groups, lr=lr)
        optimizer = self.hparams["optimizer"](params=self.parameters())  # "plateau": a partial + monitored dict
        # mode="max" on a falling loss: the schedule acts within the test's few epochs
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", patience=0, factor=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val/loss"}}


@pytest.mark.parametrize(("backend", "optimizer_path"), [("loop", "universal"), ("vmap", "auto"), ("hfta", "auto")])
def test_a_template_trial_stopped_within_an_accumulation_window_leaves_the_others_as_alone(
    backend: str, optimizer_path: str
) -> None:
    # on the loop each trial's own torchmetrics objects (train/loss, train/acc) hold the step's autograd graph: a trial
    # stopped within an epoch made the group's next backward fail there; and a stop within an accumulation window
    # dropped the others' gradients of that window (every backend)
    from tests.fused.test_accumulation_slot_changes import StopWithinTheWindow

    trials = []
    for seed, lr in enumerate((1e-3, 3e-3, 1e-2)):
        torch.manual_seed(seed)
        trials.append(template_module(lr))
    limits = dict(max_steps=4, limit_val_batches=2, accumulate_grad_batches=2)

    def fit(module: L.LightningModule, callbacks: list[L.Callback]) -> None:
        trainer = make_trainer(**limits, callbacks=callbacks)
        torch.manual_seed(1234)
        trainer.fit(module, datamodule=DigitsMNISTDataModule(batch_size=64))

    separate = [copy.deepcopy(m) for m in trials]
    for module in separate:
        fit(module, [])
    fused = FusedLightningModule(trials, backend=backend, optimizer_path=optimizer_path, summary=False)
    fit(fused, [StopWithinTheWindow()])
    assert fused.results[1]["steps"] == 1
    states = [learned_state_difference(fused.unfuse(tid), separate[tid]) for tid in (0, 2)]
    assert max(states) <= (0.0 if backend == "loop" else 1e-5), states


@pytest.mark.parametrize("form", ["parameters", "trainer_model", "decay_groups", "plateau"])
def test_every_configure_optimizers_form_trains_each_trial_as_alone(form: str) -> None:
    trials = []
    for seed, lr in enumerate((3e-3, 3e-2)):
        torch.manual_seed(seed)
        trials.append(_OptimizerForms(form, lr, optimizer=functools.partial(torch.optim.Adam, lr=lr)))

    def fit(module: L.LightningModule) -> L.Trainer:
        trainer = make_trainer(max_epochs=3, limit_train_batches=4, limit_val_batches=2)
        torch.manual_seed(1234)
        trainer.fit(module, datamodule=DigitsMNISTDataModule(batch_size=64))
        return trainer

    alone = [copy.deepcopy(m) for m in trials]
    lrs = [fit(m).optimizers[0].param_groups[0]["lr"] for m in alone]
    fused = FusedLightningModule([copy.deepcopy(m) for m in trials], backend="vmap", summary=False)
    fit(fused)
    for tid, module in enumerate(alone):
        assert fused._optimizer.trials[tid].optimizer.param_groups[0]["lr"] == lrs[tid]
        for key, value in module.state_dict().items():
            torch.testing.assert_close(fused.unfuse(tid).state_dict()[key], value, rtol=1e-4, atol=1e-6)
    if form == "plateau":
        assert lrs[0] < 3e-3, lrs  # the plateau schedule really reduced the rates
        assert lrs[1] < 3e-2, lrs
