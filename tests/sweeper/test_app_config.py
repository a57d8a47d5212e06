import pytest
from omegaconf import DictConfig, OmegaConf

from lightning_hydro.sweeper.app_config import check_sweep_keys, config_section, has_key, similar_keys

CFG = OmegaConf.create(
    {
        "model": {"lr": 0.1, "hidden_dim": 64, "momentum": "???"},
        "data": {"batch_size": 64},
        "trainer": {"max_epochs": 2},
        "hydra": {"runtime": {"choices": {"optim": "sgd"}}},
    }
)


def test_has_key_and_similar_keys():
    assert has_key(CFG, "model.lr")
    assert has_key(CFG, "model.momentum")  # mandatory ??? counts
    assert not has_key(CFG, "model.lrr")
    assert not has_key(CFG, "model.lr.x")
    assert similar_keys(CFG, "data.batchsize") == ["data.batch_size"]


def test_accepts_model_keys_declared_non_fusible_keys_groups_and_additions():
    check_sweep_keys(
        CFG,
        {"model.lr": "", "data.batch_size": "", "optim": "", "model.extra": "+"},
        ["data.batch_size", "optim"],
    )


@pytest.mark.parametrize(
    ("swept", "non_fusible", "match"),
    [
        (
            {"model.lr": ""},
            ["data.batchsize"],
            (
                r"non-fusible key 'data.batchsize' is not in the config "
                r"\(did you mean 'data.batch_size'\?\)\. Expected a key.*"
                r"Fix: correct or remove it in hydra.sweeper.non_fusible"
            ),
        ),
        (
            {"data.batch_size": ""},
            [],
            (
                r"'data.batch_size' is searched but not declared non-fusible; only keys under 'model' may "
                r"differ.*Fix: add 'data.batch_size' to hydra.sweeper.non_fusible"
            ),
        ),
        ({"optim": ""}, [], r"'optim' is searched but not declared non-fusible"),
        (
            {"model.lrr": ""},
            [],
            (
                r"searched key 'model.lrr' is not in the config \(did you mean 'model.lr'.*\)\. Fix: correct "
                r"the key, or add it with '\+model.lrr=...'"
            ),
        ),
    ],
)
def test_errors(swept, non_fusible, match):
    with pytest.raises(ValueError, match=match):
        check_sweep_keys(CFG, swept, non_fusible)


def test_a_config_section_is_a_plain_dict_with_its_interpolations_resolved():
    trainer = {"default_root_dir": "${paths.out}", "max_epochs": 2}
    cfg = OmegaConf.create({"paths": {"out": "/runs"}, "trainer": trainer})
    section = config_section(cfg.trainer, what="the config's 'trainer'")
    assert section == {"default_root_dir": "/runs", "max_epochs": 2}
    assert type(section) is dict
    assert config_section({"name": "asha", 3: "x"}, what="s") == {"name": "asha", "3": "x"}  # settings given in code


@pytest.mark.parametrize("absent", [None, DictConfig(None)])
def test_an_absent_or_null_config_section_is_empty(absent):
    assert config_section(absent, what="s") == {}


@pytest.mark.parametrize("value", [True, 3, "asha", [1, 2], OmegaConf.create([1, 2])])
def test_a_value_where_a_config_section_belongs_is_refused(value):
    with pytest.raises(
        ValueError,
        match=(
            r"^lightning_hydro sweeper: hydra.sweeper.scheduler must be a section \(key: value entries\) or null, "
            r"got .*\. Fix: write it as key: value entries \(e\.g\. trainer: \{max_epochs: 10\}\), or leave it out\.$"
        ),
    ):
        config_section(value, what="lightning_hydro sweeper: hydra.sweeper.scheduler")
