import copy
import pickle

import lightning as L
import pytest
import torch

from lightning_hydro.demos.digits import DigitsDataModule, DigitsMLP
from lightning_hydro.scaling import Surrogate, WidthScaling
from lightning_hydro.scaling.multipliers import Multipliers
from lightning_hydro.scaling.width_scaling import fold_multipliers, width_scaling_of


def build(**hp) -> DigitsMLP:
    return Surrogate(DigitsMLP, width="hidden_dim", ratio=4).build(hidden_dim=128, **hp)


def trainer(tmp_path, **kwargs) -> L.Trainer:
    # accelerator left to Lightning ("auto": the GPU where there is one): these tests check learning-rate
    # multipliers and checkpoints, which hold on any device (Lightning moves the module back to the CPU after fit)
    return L.Trainer(
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=1,
        **kwargs,
    )


def test_record_roundtrips_through_plain_data():
    scaling = build().width_scaling
    record = scaling.to_dict()
    assert record["base_shapes"]["body.0.weight"] == [128, None]
    assert WidthScaling.from_dict(pickle.loads(pickle.dumps(record))) == scaling


def test_from_dict_names_what_is_missing():
    with pytest.raises(ValueError, match=r"not a width-scaling record, missing \['base_shapes', 'readouts'\]"):
        WidthScaling.from_dict({"ratio": 2, "widths": {}})


def test_attach_twice_is_an_error():
    model = build()
    with pytest.raises(ValueError, match=r"DigitsMLP is already scaled \(ratio 4\); build a fresh module"):
        model.width_scaling.attach(model)


def test_multipliers_by_name():
    model = build()
    mults = model.width_scaling.multipliers(model, "adam")
    assert mults["body.2.weight"] == Multipliers(4.0, 0.25)
    assert mults["body.0.weight"] == mults["head.weight"] == Multipliers(1.0, 1.0)


def test_infshape_is_set_for_mup_tools():
    model = build()
    assert model.body[2].weight.infshape.width_mult() == 0.25


def test_fold_multipliers_needs_a_scaled_module_and_its_own_parameters():
    plain = DigitsMLP()
    with pytest.raises(ValueError, match=r"DigitsMLP has no width scaling; build it with Surrogate.build\(\)"):
        fold_multipliers(plain, torch.optim.SGD(plain.parameters(), lr=0.1))
    model = build()
    stranger = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match=r"holds a tensor of shape \(3,\) that is not a parameter of DigitsMLP"):
        fold_multipliers(model, torch.optim.SGD([*model.parameters(), stranger], lr=0.1))


def test_folding_twice_changes_nothing():
    model = build(optimizer="adam", lr=0.1)
    optimizer = model.configure_optimizers()
    lrs = [g["lr"] for g in optimizer.param_groups]
    fold_multipliers(model, optimizer)
    assert [g["lr"] for g in optimizer.param_groups] == lrs


def test_unscaled_module_has_no_record():
    assert width_scaling_of(DigitsMLP()) is None


def test_deepcopy_and_pickle_keep_the_wrappers_bound_to_the_copy():
    model = build(optimizer="adam")
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        optimizer = twin.configure_optimizers()
        assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {id(p) for p in twin.parameters()}
        assert sorted({g["mup_lr_mult"] for g in optimizer.param_groups}) == [1.0, 4.0]


def test_lightning_trains_a_surrogate_and_its_checkpoint_rebuilds_it(tmp_path):
    torch.manual_seed(0)
    model = build(optimizer="adam", lr=0.01)
    fit = trainer(tmp_path, max_steps=5, limit_train_batches=5, max_epochs=1)
    fit.fit(model, datamodule=DigitsDataModule(batch_size=32))
    assert {g["mup_lr_mult"] for g in fit.optimizers[0].param_groups} == {1.0, 4.0}
    path = tmp_path / "surrogate.ckpt"
    fit.save_checkpoint(path)

    checkpoint = torch.load(path, weights_only=False)
    assert WidthScaling.from_dict(checkpoint["width_scaling"]) == model.width_scaling
    assert {g["mup_lr_mult"] for g in checkpoint["optimizer_states"][0]["param_groups"]} == {1.0, 4.0}

    s = Surrogate(DigitsMLP, width="hidden_dim")  # the ratio comes from the checkpoint
    restored = s.load_from_checkpoint(path)
    assert restored.width_scaling == model.width_scaling
    x = torch.rand(3, 64)
    torch.testing.assert_close(restored(x), model(x))


def test_training_resumes_from_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    first = trainer(tmp_path, max_steps=3, max_epochs=1)
    model = build(optimizer="adam", lr=0.01)
    first.fit(model, datamodule=DigitsDataModule(batch_size=32))
    first.save_checkpoint(tmp_path / "a.ckpt")
    resumed = build(optimizer="adam", lr=0.01)
    second = trainer(tmp_path, max_steps=6, max_epochs=5)
    second.fit(resumed, datamodule=DigitsDataModule(batch_size=32), ckpt_path=tmp_path / "a.ckpt")
    assert second.global_step == 6
    assert sorted(g["lr"] for g in second.optimizers[0].param_groups) == pytest.approx([0.01, 0.04])


def test_load_from_checkpoint_needs_a_surrogate_checkpoint():
    s = Surrogate(DigitsMLP, width="hidden_dim")
    with pytest.raises(ValueError, match=r"has no 'width_scaling' record, so it was not saved from a surrogate"):
        s.load_from_checkpoint({"state_dict": {}})
