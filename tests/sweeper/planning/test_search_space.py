import pytest

from lightning_hydro.sweeper.planning.search_space import Choice, Interval, override_key, parse_search_space


def test_parses_every_supported_form():
    space = parse_search_space(
        [
            "model.lr=tag(log, interval(1e-4, 1))",
            "model.momentum=interval(0, 0.99)",
            "model.hidden_dim=tag(int, interval(8, 64))",
            "data.batch_size=32,64",
            "model.optimizer=choice(sgd, 'adam')",
            "model.depth=range(1, 4)",
            "trainer.max_epochs=3",
        ]
    )
    assert space.keys == [
        "model.lr",
        "model.momentum",
        "model.hidden_dim",
        "data.batch_size",
        "model.optimizer",
        "model.depth",
    ]
    assert space.dimension("model.lr") == Interval("model.lr", 1e-4, 1.0, log=True)
    assert space.dimension("model.hidden_dim") == Interval("model.hidden_dim", 8.0, 64.0, integer=True)
    bs = space.dimension("data.batch_size")
    assert isinstance(bs, Choice)
    assert bs.values == (32, 64)
    assert bs.texts == ("32", "64")
    opt = space.dimension("model.optimizer")
    assert isinstance(opt, Choice)
    assert opt.values == ("sgd", "adam")
    assert space.dimension("model.depth").values == (1, 2, 3)  # type: ignore[union-attr]
    assert space.fixed == ("trainer.max_epochs=3",)


def test_later_lines_replace_earlier_ones_and_prefixes_are_kept():
    space = parse_search_space(["model.lr=0.1,0.2", "model.lr=interval(0.1, 0.2)", "+model.extra=1,2"])
    assert isinstance(space.dimension("model.lr"), Interval)
    assert space.override_lines({"model.lr": "0.15", "model.extra": "2"}) == [
        "model.lr=0.15",
        "+model.extra=2",
    ]


def test_interval_values_are_clipped_and_rounded():
    dim = Interval("k", 1.0, 10.0, integer=True)
    assert dim.at(3.6) == (4, "4")
    assert dim.at(50.0) == (10, "10")
    assert Interval("k", 0.0, 1.0).at(0.25) == (0.25, "0.25")


def test_override_key():
    assert override_key("++a.b=1") == "a.b"
    assert override_key("trainer.max_epochs=2") == "trainer.max_epochs"


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        ([], "the search space is empty: no key is swept"),
        (["trainer.max_epochs=3"], "the search space is empty"),
        (
            ["model.lr=interval(1e-3"],
            r"cannot parse search space entry 'model.lr=interval\(1e-3'.*Expected Hydra's",
        ),
        (
            ["model.lr=interval(1, 0.1)"],
            r"empty interval: expected low < high, got low=1.0, high=0.1. Fix: swap",
        ),
        (["model.lr=tag(log, interval(0, 1))"], r"needs low > 0. Fix: use a positive lower bound"),
        (
            ["model.lr=tag(exp, interval(0.1, 1))"],
            r"unknown tag\(s\) \['exp'\]; supported tags are \['int', 'log'\]",
        ),
        (["model.lr=tag(log, choice(0.1, 1))"], r"tags a ChoiceSweep.*apply to interval\(...\) only"),
        (["model.depth=range(3, 1)"], r"has no values; give at least one value"),
        (["model.depth=tag(int, interval(1.2, 1.8))"], r"holds no integer; widen the interval"),
        (["hydra.job.name=a,b"], r"sweeps Hydra's own config"),
        (["~model.lr=a,b"], r"sweeps a deletion"),
        (["model=glob(*)"], r"is not supported \(glob sweeps"),
    ],
)
def test_errors_say_what_and_how_to_fix(lines, match):
    with pytest.raises(ValueError, match=match):
        parse_search_space(lines)


def test_override_key_rejects_bad_grammar():
    with pytest.raises(ValueError, match=r"cannot parse override 'a=\('"):
        override_key("a=(")
