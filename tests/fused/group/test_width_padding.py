"""Trials of different widths fused by zero-padding equal the same trials trained alone (issue 14, items 1, 4).

The three models of the issue: the template's SimpleDenseNet (Linear-BatchNorm1d-ReLU blocks of three
searched sizes), a CNN whose channel count varies, and a small Transformer whose feed-forward width varies.
Per trial: first-step gradients to float32 rounding over the trial's own parameters, the weights after
training, validation metrics after 2 epochs; the padding stays exactly zero throughout.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends import FusionError
from lightning_hydro.demos.template_mnist import DigitsMNISTDataModule, MNISTLitModule, SimpleDenseNet
from lightning_hydro.stacking.width_plan import WidthPaddingError
from tests.helpers import DigitsCNN, fit_digits, make_trainer, max_state_difference, token_data

TOLERANCE = 1e-5  # ||g_fused - g_alone|| / ||g_alone|| over the trial's true-width parameters


def make_optimizer(module: L.LightningModule, default: str) -> torch.optim.Optimizer:
    """Adam, AdamW (decoupled decay, amsgrad) or SGD with momentum and weight decay, as ``hparams.optimizer`` says."""
    name, lr = module.hparams.get("optimizer", default), module.hparams["lr"]
    if name == "adam":
        return torch.optim.Adam(module.parameters(), lr=lr, eps=1e-6)
    if name == "adamw":
        return torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.1, amsgrad=True)
    return torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9, weight_decay=1e-2)


class DenseNetClassifier(L.LightningModule):
    """The template's SimpleDenseNet in a LightningModule that logs plain tensors (so that vmap runs it)."""

    def __init__(
        self, lin1_size: int, lin2_size: int, lin3_size: int, lr: float = 1e-3, optimizer: str = "adam"
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = SimpleDenseNet(lin1_size=lin1_size, lin2_size=lin2_size, lin3_size=lin3_size)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(-1) == y).float().mean())

    def configure_optimizers(self) -> Any:
        return make_optimizer(self, "adam")


class FeedForwardLM(L.LightningModule):
    """Embedding + torch's TransformerEncoderLayer with a searched feed-forward width + readout."""

    def __init__(
        self, dim_feedforward: int, lr: float = 1e-3, d_model: int = 16, vocab: int = 20, optimizer: str = "adamw"
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, d_model)
        self.layer = nn.TransformerEncoderLayer(d_model, 2, dim_feedforward, dropout=0.0, batch_first=True)
        self.readout = nn.Linear(d_model, vocab)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        mask = nn.Transformer.generate_square_subsequent_mask(x.size(1))
        logits = self.readout(self.layer(self.embed(x), src_mask=mask, is_causal=True))
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return make_optimizer(self, "adamw")

    def train_dataloader(self) -> DataLoader:
        return DataLoader(token_data(), batch_size=32)


class LayerNormMLP(L.LightningModule):
    """A hidden LayerNorm over the searched width, with a sigmoid (sigmoid(0) != 0) and SGD with momentum."""

    def __init__(self, width: int, lr: float = 0.05, optimizer: str = "sgd") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Linear(64, width), nn.LayerNorm(width), nn.Sigmoid(), nn.Linear(width, 10))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.body(x), y)

    def configure_optimizers(self) -> Any:
        return make_optimizer(self, "sgd")


def _double(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.double() if batch.is_floating_point() else batch
    return type(batch)(_double(b) for b in batch)


def float64_version(cls: type[L.LightningModule]) -> type[L.LightningModule]:
    """The same module computing in float64 (its batches cast): float32 rounding, amplified over many steps by
    ReLU kinks and normalisation, would hide whether padding itself changes anything."""

    class Float64(cls):  # type: ignore[valid-type, misc]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return super().training_step(_double(batch), batch_idx)

    Float64.__name__ = f"{cls.__name__}Float64"
    return Float64


class _DoubleInputCNN(DigitsCNN):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.double())


FLOAT64 = {
    "densenet": float64_version(DenseNetClassifier),
    "cnn": _DoubleInputCNN,
    "transformer": FeedForwardLM,  # token ids in, no float input
    "layernorm_sigmoid": float64_version(LayerNormMLP),
}


def digits_28(trainer: L.Trainer, module: L.LightningModule) -> None:
    trainer.fit(module, datamodule=DigitsMNISTDataModule(batch_size=64))


def tokens(trainer: L.Trainer, module: L.LightningModule) -> None:
    trainer.fit(module)


def dense_trials() -> list[L.LightningModule]:
    sizes = [(32, 16, 8), (64, 32, 16), (16, 48, 24)]
    return [_seeded(i, lambda s=s, i=i: DenseNetClassifier(*s, lr=1e-3 * (i + 1))) for i, s in enumerate(sizes)]


def cnn_trials() -> list[L.LightningModule]:
    return [_seeded(i, lambda c=c: DigitsCNN(lr=0.05, channels=c)) for i, c in enumerate((4, 8, 6))]


def transformer_trials() -> list[L.LightningModule]:
    return [_seeded(i, lambda f=f: FeedForwardLM(f, lr=3e-3)) for i, f in enumerate((16, 48, 32))]


def layer_norm_trials() -> list[L.LightningModule]:
    return [_seeded(i, lambda w=w: LayerNormMLP(w)) for i, w in enumerate((12, 24, 20))]


def _seeded(seed: int, factory: Any) -> L.LightningModule:
    torch.manual_seed(seed)
    return factory()  # type: ignore[no-any-return]


CASES = {
    "densenet": (dense_trials, digits_28),
    "cnn": (cnn_trials, fit_digits),
    "transformer": (transformer_trials, tokens),
    "layernorm_sigmoid": (layer_norm_trials, fit_digits),
}


class _FirstGradients(L.Callback):
    """Each trial's first-step gradients, at its own width (recorded before the first optimizer step)."""

    def __init__(self) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if self.grads:
            return
        if isinstance(pl_module, FusedLightningModule):
            group = pl_module._group
            self.grads = [
                {n: group.trial_view(n, row, p.grad[row]).clone() for n, p in group.params.items()}
                for row in range(group.size)
            ]
        else:
            self.grads = [{n: p.grad.detach().clone() for n, p in pl_module.named_parameters()}]


def first_gradients(module: L.LightningModule, fit: Any) -> list[dict[str, torch.Tensor]]:
    recorder = _FirstGradients()
    torch.manual_seed(1234)
    fit(make_trainer(max_steps=1, limit_val_batches=0, callbacks=[recorder]), module)
    return recorder.grads


def relative_error(fused: dict[str, torch.Tensor], alone: dict[str, torch.Tensor]) -> float:
    assert fused.keys() == alone.keys()
    mine = torch.cat([fused[n].flatten().double() for n in alone])
    theirs = torch.cat([alone[n].flatten().double() for n in alone])
    return float((mine - theirs).norm() / theirs.norm())


def padding_is_zero(fused: FusedLightningModule) -> bool:
    group = fused._group
    for name, stacked in [*group.params.items(), *group.buffers.items()]:
        for row in range(group.size):
            whole = stacked.detach()[row].clone()
            region = group.region(name, row)
            if region is None:
                continue
            whole[region] = 0
            if name.endswith("running_var"):
                continue  # BatchNorm's padded variance follows its zero inputs; the unit's affine is zero
            if whole.count_nonzero():
                return False
    return True


@pytest.mark.parametrize("backend", ["vmap", "loop"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_first_step_gradients_match_each_trial_alone(case: str, backend: str) -> None:
    make, fit = CASES[case]
    trials = make()
    alone = [first_gradients(copy.deepcopy(m), fit)[0] for m in trials]
    fused = FusedLightningModule([copy.deepcopy(m) for m in trials], backend=backend, pad_widths=True, summary=False)
    assert fused._group.is_padded
    errors = [relative_error(grads, alone[row]) for row, grads in enumerate(first_gradients(fused, fit))]
    print(f"first-step gradients, {case} padded on {backend}: relative errors {errors}")
    assert max(errors) <= TOLERANCE, errors


@pytest.mark.parametrize("case", sorted(CASES))
def test_trained_weights_match_each_trial_alone_and_padding_stays_zero(case: str) -> None:
    """15 steps of SGD with momentum and weight decay, in float64: padding changes nothing beyond rounding.

    (In float32 a trial can part from its lone run at the 1e-2 level after ~10 steps with or without padding:
    a pre-activation rounding to the other side of a ReLU kink. Adam is covered by the first-step and
    validation tests: it turns the rounding noise of gradients that are exactly zero, such as a bias before
    BatchNorm, into lr-sized steps in any two implementations.)
    """
    _, fit = CASES[case]
    cls = FLOAT64[case]
    sizes = {
        "densenet": [(32, 16, 8), (64, 32, 16), (16, 48, 24)],
        "cnn": [4, 8, 6],
        "transformer": [16, 48, 32],
        "layernorm_sigmoid": [12, 24, 20],
    }[case]
    trials = []
    for seed, size in enumerate(sizes):
        torch.manual_seed(seed)
        args = size if isinstance(size, tuple) else (size,)
        if case == "cnn":
            trials.append(cls(lr=0.05, channels=size).double())
        else:
            trials.append(cls(*args, lr=0.01, optimizer="sgd").double())
    alone = []
    for module in trials:
        module = copy.deepcopy(module)
        torch.manual_seed(1234)
        fit(make_trainer(max_steps=15, limit_val_batches=0), module)
        alone.append(module)
    fused = FusedLightningModule([copy.deepcopy(m) for m in trials], backend="vmap", pad_widths=True, summary=False)
    torch.manual_seed(1234)
    fit(make_trainer(max_steps=15, limit_val_batches=0), fused)
    differences = [max_state_difference(fused.unfuse(tid), module) for tid, module in enumerate(alone)]
    print(f"trained weights, {case}: largest relative differences {differences}")
    assert max(differences) <= 1e-10, differences
    assert padding_is_zero(fused)


def test_template_module_val_acc_after_two_epochs_is_within_one_validation_image() -> None:
    """The template's MNISTLitModule, unchanged, with its three layer sizes searched (250 validation images)."""
    sizes = [(64, 32, 16), (32, 64, 32), (128, 16, 64)]
    trials = []
    for seed, (lin1, lin2, lin3) in enumerate(sizes):
        torch.manual_seed(seed)
        trials.append(
            MNISTLitModule(
                net=SimpleDenseNet(lin1_size=lin1, lin2_size=lin2, lin3_size=lin3),
                optimizer=functools.partial(torch.optim.Adam, lr=2e-3),
                scheduler=None,
            )
        )

    def val_acc(module: L.LightningModule) -> dict[str, float]:
        trainer = make_trainer(max_epochs=2)
        torch.manual_seed(1234)
        trainer.fit(module, datamodule=DigitsMNISTDataModule(batch_size=128))
        return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/acc")}

    alone = [val_acc(copy.deepcopy(m))["val/acc"] for m in trials]
    fused = FusedLightningModule([copy.deepcopy(m) for m in trials], pad_widths=True, summary=False)
    fused_metrics = val_acc(fused)
    images = [round(abs(fused_metrics[f"val/acc/trial_{tid}"] - acc) * 250, 3) for tid, acc in enumerate(alone)]
    print(f"val/acc padded {fused.backend} vs alone, in images of 250:", images, "accuracies", alone)
    assert max(images) <= 1.0, images
    assert [fused.unfuse(t).net.model[0].out_features for t in range(3)] == [64, 32, 128]


def test_dense_val_acc_after_two_epochs_on_vmap_is_within_one_validation_image() -> None:
    trials = dense_trials()

    def accuracies(module: L.LightningModule) -> list[float]:
        trainer = make_trainer(max_epochs=2)
        torch.manual_seed(1234)
        digits_28(trainer, module)
        metrics = trainer.callback_metrics
        if isinstance(module, FusedLightningModule):
            return [float(metrics[f"val_acc/trial_{tid}"]) for tid in module.trial_ids]
        return [float(metrics["val_acc"])]

    alone = [accuracies(copy.deepcopy(m))[0] for m in trials]
    fused = FusedLightningModule([copy.deepcopy(m) for m in trials], backend="vmap", pad_widths=True, summary=False)
    images = [round(abs(a - b) * 250, 3) for a, b in zip(accuracies(fused), alone)]
    print("val_acc padded vmap vs alone, in images of 250:", images)
    assert max(images) <= 1.0, images


def test_unfuse_returns_each_trial_at_its_own_width_with_compact_tensors() -> None:
    trials = cnn_trials()
    fused = FusedLightningModule(trials, backend="vmap", pad_widths=True, summary=False)
    fit_digits(make_trainer(max_steps=3, limit_val_batches=0), fused)
    for tid, channels in enumerate((4, 8, 6)):
        module = fused.unfuse(tid)
        assert module.features[0].weight.shape == (channels, 1, 3, 3)
        assert module.features[1].running_mean.shape == (channels,)  # BatchNorm statistics sliced too
        assert module.head.weight.shape == (10, 8 * channels)
        assert module.features[1].running_mean.untyped_storage().nbytes() == channels * 4
        assert max_state_difference(module, fused.trial_module(tid)) == 0.0


def test_checkpoint_resume_with_mixed_widths(tmp_path: Any) -> None:
    trials = cnn_trials()
    straight = FusedLightningModule([copy.deepcopy(m) for m in trials], backend="vmap", pad_widths=True, summary=False)
    torch.manual_seed(1234)
    fit_digits(make_trainer(max_epochs=2, limit_val_batches=0), straight)

    first = FusedLightningModule([copy.deepcopy(m) for m in trials], backend="vmap", pad_widths=True, summary=False)
    torch.manual_seed(1234)
    fit_digits(make_trainer(max_epochs=1, limit_val_batches=0), first)
    path = tmp_path / "group.ckpt"
    first.trainer.save_checkpoint(path)
    resumed = FusedLightningModule([copy.deepcopy(m) for m in trials], backend="vmap", pad_widths=True, summary=False)
    torch.manual_seed(1234)
    fit_digits(make_trainer(max_epochs=2, limit_val_batches=0), resumed, ckpt_path=path)
    for tid in range(3):
        assert resumed.unfuse(tid).features[0].out_channels == (4, 8, 6)[tid]
        assert max_state_difference(resumed.unfuse(tid), straight.unfuse(tid)) <= 1e-4


def test_stopping_the_widest_trial_shrinks_the_group_and_a_wider_refill_widens_it() -> None:
    trials = cnn_trials()
    fused = FusedLightningModule(trials, backend="vmap", pad_widths=True, summary=False, max_slots=3)
    fit_digits(make_trainer(max_steps=2, limit_val_batches=0), fused)
    assert fused.stacked.get_parameter("head__weight").shape == (3, 10, 64)
    fused.stop_trial(1)  # the 8-channel trial
    assert fused.stacked.get_parameter("head__weight").shape == (2, 10, 48)
    before = {tid: copy.deepcopy(fused.trial_module(tid).state_dict()) for tid in fused.trial_ids}
    torch.manual_seed(7)
    newcomer = DigitsCNN(lr=0.05, channels=10)
    tid = fused.add_trial(copy.deepcopy(newcomer))
    assert fused.stacked.get_parameter("head__weight").shape == (3, 10, 80)
    for old, state in before.items():  # survivors keep their weights through both reshapes
        for key, value in state.items():
            assert torch.equal(fused.trial_module(old).state_dict()[key], value), key
    assert max_state_difference(fused.unfuse(tid), newcomer) == 0.0
    assert padding_is_zero(fused)


def test_a_searched_output_size_is_refused_naming_the_module_and_its_line() -> None:
    trials = [
        MNISTLitModule(net=SimpleDenseNet(output_size=n), optimizer=functools.partial(torch.optim.Adam), scheduler=None)
        for n in (10, 12)
    ]
    with pytest.raises(
        WidthPaddingError,
        match=r"module 'net\.model\.9' \(Linear, built at .*template_mnist\.py:\d+ "
        r"in SimpleDenseNet\): its out_features differs .* an output whose size is searched",
    ):
        FusedLightningModule(trials, pad_widths=True)


def test_pad_widths_refuses_the_fused_optimizer_path() -> None:
    with pytest.raises(
        ValueError,
        match=r"pad_widths=True steps each trial's own optimizer .* got "
        r"optimizer_path='fused'\. Use optimizer_path='auto' or 'universal'",
    ):
        FusedLightningModule(cnn_trials(), pad_widths=True, optimizer_path="fused")


def test_without_pad_widths_different_widths_are_still_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"Trial 1 cannot be fused with trial 0: they differ only in sizes \('features\.0\.bias' is \[8\] "
        r"where trial 0 has \[4\];.*pad_widths=True fuses them",
    ):
        FusedLightningModule(cnn_trials())


class LiteralReshape(L.LightningModule):
    """Reshapes its hidden activations to a literal size: meaningless at a padded width."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width
        self.encode = nn.Linear(64, width)
        self.decode = nn.Linear(width, 10)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        h = torch.relu(self.encode(x)).reshape(x.size(0), 2, 8)  # the width 16, written out
        return F.cross_entropy(self.decode(h.reshape(x.size(0), 16)), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_reshape_to_a_literal_size_fails_naming_the_line() -> None:
    trials = [LiteralReshape(16), LiteralReshape(24)]
    fused = FusedLightningModule(trials, backend="vmap", pad_widths=True, summary=False)
    with pytest.raises(
        FusionError,
        match=r"test_width_padding\.py:\d+.*With padded widths, every trial's code runs at "
        r"the group's largest sizes",
    ):
        fit_digits(make_trainer(max_steps=1, limit_val_batches=0), fused)


def test_the_first_batch_float64_recheck_runs_a_padded_twin_at_each_trial_s_width() -> None:
    """The first-batch check reruns a failing float32 comparison in float64 on a copy of the group: padded too."""
    from lightning_hydro.backends import make_backend
    from lightning_hydro.fused.verify.fusion import _float64_fused_run, _float64_run, _persists_in_float64
    from lightning_hydro.stacking import StackedState

    trials = layer_norm_trials()
    group = StackedState(nn.Module(), trials, [0, 1, 2], pad_widths=True)
    backend = make_backend("vmap", group)
    batch = (torch.randn(16, 64), torch.randint(0, 10, (16,)))
    names = list(group.params)
    fused64 = _float64_fused_run(group, backend, names, batch, 0)
    assert not isinstance(fused64, str), fused64
    for row, module in enumerate(trials):
        ref_loss, ref_grads, why = _float64_run(module, names, batch, 0)
        assert why == ""
        trains = [True] * len(names)
        assert _persists_in_float64(fused64, row, names, ref_loss, ref_grads, 64 * 24, group, trains) == []
