import pytest

from lightning_hydro.stopping.halving_config import (
    HalvingConfig,
    check_budget,
    check_trial_id,
    check_value,
    keep_count,
)


@pytest.mark.parametrize(
    ("grace_period", "reduction_factor", "max_t", "milestones"),
    [
        (1, 3, 9, (1, 3, 9)),
        (1, 3, 10, (1, 3, 9)),
        (1, 2, 16, (1, 2, 4, 8, 16)),
        (2, 3, 20, (2, 6, 18)),
        (5, 4, 5, (5,)),
        (100, 3, 2700, (100, 300, 900, 2700)),
    ],
)
def test_milestones_are_grace_period_times_powers_of_eta_up_to_max_t(
    grace_period: int, reduction_factor: int, max_t: int, milestones: tuple[int, ...]
) -> None:
    config = HalvingConfig("min", grace_period, reduction_factor, max_t)
    assert config.milestones == milestones
    assert config.top_milestone == milestones[-1]


def test_milestone_lookups() -> None:
    config = HalvingConfig("max", 1, 3, 27)
    assert [config.milestone_at_or_below(b) for b in (0, 1, 2, 3, 8, 9, 26, 27, 40)] == [
        None, 1, 1, 3, 3, 9, 9, 27, 27,
    ]  # fmt: skip
    assert [config.next_milestone(b) for b in (0, 1, 5, 27)] == [1, 3, 9, None]
    assert config.rung_of(9) == 2
    assert config.with_grace_period(3).milestones == (3, 9, 27)
    assert config.to_dict() == {"mode": "max", "grace_period": 1, "reduction_factor": 3, "max_t": 27}


def test_mode_must_be_min_or_max() -> None:
    with pytest.raises(ValueError, match=r"mode must be 'min' or 'max', got 'minimize'\. Use mode='min'"):
        HalvingConfig("minimize", 1, 3, 9)  # type: ignore[arg-type]


@pytest.mark.parametrize("reduction_factor", [1, 0, -3])
def test_reduction_factor_must_exceed_one(reduction_factor: int) -> None:
    with pytest.raises(
        ValueError, match=rf"reduction_factor must be an integer >= 2, got {reduction_factor}\. .*use 2, 3"
    ):
        HalvingConfig("min", 1, reduction_factor, 9)


@pytest.mark.parametrize(("name", "kwargs"), [
    ("reduction_factor", {"reduction_factor": 2.5}),
    ("grace_period", {"grace_period": 1.0}),
    ("max_t", {"max_t": "9"}),
    ("reduction_factor", {"reduction_factor": True}),
])  # fmt: skip
def test_budgets_and_eta_must_be_integers(name: str, kwargs: dict[str, object]) -> None:
    arguments: dict[str, object] = {
        "mode": "min",
        "grace_period": 1,
        "reduction_factor": 3,
        "max_t": 9,
    } | kwargs
    with pytest.raises(TypeError, match=rf"HalvingConfig: {name} must be an integer, got .*Budgets are whole"):
        HalvingConfig(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("grace_period", [0, -1])
def test_grace_period_must_be_at_least_one(grace_period: int) -> None:
    with pytest.raises(ValueError, match=rf"grace_period must be >= 1, got {grace_period}\. .*use grace_period=1"):
        HalvingConfig("min", grace_period, 3, 9)


def test_grace_period_must_not_exceed_max_t() -> None:
    with pytest.raises(
        ValueError,
        match=r"grace_period \(10\) must not exceed max_t \(9\).*Lower grace_period or raise max_t",
    ):
        HalvingConfig("min", 10, 3, 9)


@pytest.mark.parametrize(
    ("n", "eta", "ceil", "floor"),
    [
        (0, 3, 0, 0),
        (1, 3, 1, 1),
        (2, 3, 1, 1),
        (3, 3, 1, 1),
        (4, 3, 2, 1),
        (10, 3, 4, 3),
        (27, 3, 9, 9),
        (34, 3, 12, 11),
    ],
)
def test_keep_count(n: int, eta: int, ceil: int, floor: int) -> None:
    assert keep_count(n, eta) == keep_count(n, eta, "ceil") == ceil
    assert keep_count(n, eta, "floor") == floor


def test_keep_count_rejects_unknown_rounding() -> None:
    with pytest.raises(ValueError, match=r"rounding must be 'ceil' or 'floor', got 'round'"):
        keep_count(5, 3, "round")  # type: ignore[arg-type]


def test_value_budget_and_trial_id_checks() -> None:
    assert check_value(1, where="w") == 1.0
    assert check_value(float("nan"), where="w") != check_value(float("nan"), where="w")  # NaN passes
    with pytest.raises(TypeError, match=r"w: the monitored value must be a real number \(int or float\), got str"):
        check_value("0.3", where="w")
    with pytest.raises(TypeError, match=r"got NoneType None\. Pass a float"):
        check_value(None, where="w")
    with pytest.raises(TypeError, match=r"w: budget must be an integer number of epochs or steps, got float 1\.5"):
        check_budget(1.5, where="w")
    with pytest.raises(ValueError, match=r"w: budget must be >= 0, got -1"):
        check_budget(-1, where="w")
    with pytest.raises(TypeError, match=r"w: trial_id must be an int or a str, got tuple"):
        check_trial_id((1, 2), where="w")


def test_numpy_scalars_are_accepted_as_values_and_budgets() -> None:
    np = pytest.importorskip("numpy")
    assert check_value(np.float32(0.5), where="w") == 0.5
    budget = check_budget(np.int64(3), where="w")
    assert budget == 3
    assert type(budget) is int
