import copy

import lightning as L
import pytest
import torch
from torch.func import functional_call, stack_module_state, vmap

from lightning_hydro.demos.char_lm import (
    STDLIB_FILES,
    VOCAB_SIZE,
    CharDataModule,
    CharTransformer,
    decode,
    encode,
    read_stdlib,
)
from lightning_hydro.scaling import Surrogate


def test_reads_the_standard_library_in_a_fixed_order():
    assert list(STDLIB_FILES) == sorted(STDLIB_FILES)
    texts = read_stdlib(("bisect.py", "heapq.py"))
    assert len(texts) == 2
    assert "def insort" in texts[0]
    assert sum(len(t) for t in read_stdlib()) > 300_000


def test_missing_files_are_named():
    with pytest.raises(FileNotFoundError, match=r"\['no_such_module.py'\] not found under .*files=\.\.\."):
        read_stdlib(("bisect.py", "no_such_module.py"))


def test_encoding_is_ascii_and_roundtrips():
    codes = encode("x = 1  # ünïcode")
    assert codes.dtype == torch.long
    assert int(codes.max()) < VOCAB_SIZE
    assert decode(codes) == "x = 1  # ?n?code"


def test_datamodule_splits_every_file_and_batches_windows():
    dm = CharDataModule(block_size=16, batch_size=4, files=("bisect.py", "heapq.py"))
    dm.setup()
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (4, 16)
    torch.testing.assert_close(x[:, 1:], y[:, :-1])
    train, val = len(dm.train_set), len(dm.val_set)
    assert 8 < train / val < 10
    again = CharDataModule(block_size=16, batch_size=4, files=("bisect.py", "heapq.py"))
    again.setup()
    torch.testing.assert_close(next(iter(again.train_dataloader()))[0], x)  # seeded order


def test_datamodule_arguments_are_checked():
    with pytest.raises(ValueError, match=r"block_size and batch_size must be >= 1, got 0 and 4"):
        CharDataModule(block_size=0, batch_size=4)
    with pytest.raises(ValueError, match=r"val_fraction must be in \(0, 1\), got 1.0"):
        CharDataModule(val_fraction=1.0)


def test_model_arguments_are_checked():
    with pytest.raises(ValueError, match=r"d_model \(30\) must be a multiple of n_heads \(4\)"):
        CharTransformer(d_model=30)
    with pytest.raises(ValueError, match=r"warmup_steps must be >= 0, got -1"):
        CharTransformer(warmup_steps=-1)


def test_forward_is_causal():
    torch.manual_seed(0)
    model = CharTransformer(d_model=32, block_size=16)
    codes = torch.randint(0, VOCAB_SIZE, (2, 16))
    changed = codes.clone()
    changed[:, 10:] = 0
    torch.testing.assert_close(model(codes)[:, :10], model(changed)[:, :10])
    assert model(codes[:, :5]).shape == (2, 5, VOCAB_SIZE)


def test_runs_under_vmap_as_a_stacked_muP_group():
    s = Surrogate(CharTransformer, width="d_model", ratio=4)
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        model = s.build(d_model=64, block_size=16, lr=1e-3 * (seed + 1))
        torch.nn.init.normal_(model.head.weight)
        models.append(model)
    assert models[0].width_scaling.readouts == ("head",)
    params, buffers = stack_module_state(models)
    template = copy.deepcopy(models[0]).to("meta")
    codes = torch.randint(0, VOCAB_SIZE, (2, 16))
    out = vmap(lambda p, b: functional_call(template, (p, b), (codes,)))(params, buffers)
    for index, model in enumerate(models):
        torch.testing.assert_close(out[index], model(codes), rtol=1e-4, atol=1e-5)


def test_warmup_scheduler_keeps_mup_multipliers():
    model = Surrogate(CharTransformer, width="d_model", ratio=2).build(d_model=64, lr=1e-2, warmup_steps=10)
    config = model.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"
    assert sorted({g["mup_lr_mult"] for g in optimizer.param_groups}) == [1.0, 2.0]
    for group, base in zip(optimizer.param_groups, scheduler.base_lrs):
        assert base == pytest.approx(1e-2 * group["mup_lr_mult"])
        assert group["lr"] == pytest.approx(base / 10)
    decayed = [g for g in optimizer.param_groups if g["weight_decay"] > 0]
    assert not decayed  # weight_decay=0.0 by default
    assert CharTransformer(warmup_steps=0).configure_optimizers().__class__ is torch.optim.AdamW


def test_lightning_trains_it(tmp_path):
    # accelerator left to Lightning ("auto": the GPU where there is one): the claims below (a loss under uniform
    # guessing, bits per character as the loss over ln 2) hold on any device
    torch.manual_seed(0)
    model = CharTransformer(d_model=32, block_size=32, lr=1e-2, warmup_steps=5)
    trainer = L.Trainer(
        max_epochs=1,
        limit_train_batches=20,
        limit_val_batches=2,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=CharDataModule(block_size=32, batch_size=8, files=("bisect.py", "heapq.py")))
    assert float(trainer.callback_metrics["val_loss"]) < 4.0  # below uniform guessing, log(128) = 4.85
    assert float(trainer.callback_metrics["val_bpc"]) == pytest.approx(
        float(trainer.callback_metrics["val_loss"]) / 0.6931, rel=1e-3
    )
