import pytest

from lightning_hydro.sweeper.planning.fusion_limit import FusionProbe, fusion_limit_from_probe, measure_fusion_limit

GIB = 2**30


def test_memory_extrapolates_linearly():
    probe = FusionProbe(memory_bytes=(2 * GIB, 3 * GIB), step_seconds=(0.1, 0.12), capacity_bytes=80 * GIB)
    # budget 64 GiB: 2 + (B - 1) * 1 <= 64  ->  B = 63
    assert fusion_limit_from_probe(probe, safety_margin=0.2, max_limit=1000) == 63
    assert fusion_limit_from_probe(probe, safety_margin=0.2, max_limit=16) == 16
    assert probe.memory_at(63) == 64 * GIB


def test_flat_memory_gives_the_cap_and_one_trial_that_barely_fits_gives_one():
    flat = FusionProbe(memory_bytes=(GIB, GIB), step_seconds=(0.1, 0.1), capacity_bytes=2 * GIB)
    assert fusion_limit_from_probe(flat, safety_margin=0.0, max_limit=8) == 8
    tight = FusionProbe(memory_bytes=(GIB, 2 * GIB), step_seconds=(0.1, 0.2), capacity_bytes=1.5 * GIB)
    assert fusion_limit_from_probe(tight, safety_margin=0.0, max_limit=8) == 1


@pytest.mark.parametrize(
    ("probe", "kwargs", "match"),
    [
        (
            FusionProbe((9 * GIB, 10 * GIB), (1, 1), 10 * GIB),
            {"safety_margin": 0.2, "max_limit": 8},
            r"one trial needs 9216 MiB, more than the 8192 MiB allowed.*Fix",
        ),
        (
            FusionProbe((GIB, GIB), (1, 1), 10 * GIB),
            {"safety_margin": 1.0, "max_limit": 8},
            r"safety_margin must be in \[0, 1\), got 1.0",
        ),
        (
            FusionProbe((GIB, GIB), (1, 1), 10 * GIB),
            {"safety_margin": 0.1, "max_limit": 0},
            "max_limit must be >= 1, got 0",
        ),
    ],
)
def test_errors(probe, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fusion_limit_from_probe(probe, **kwargs)


def test_the_probe_measures_the_partition_fused_at_one_and_two_trials():
    from lightning_hydro.demos import DigitsDataModule, DigitsMLP
    from lightning_hydro.sweeper import ConfigTrainerFactory

    limit, probe = measure_fusion_limit(
        lambda t: DigitsMLP(hidden_dim=16, lr=0.1 * (t + 1)),
        [0, 1],
        datamodule=DigitsDataModule(),
        trainer_factory=ConfigTrainerFactory({"accelerator": "cpu"}),
        safety_margin=0.2,
        max_limit=8,
    )
    m1, m2 = probe.memory_bytes
    assert 0 < m1 < m2 < 2.2 * m1, (m1, m2)  # a second trial adds about one trial's share of the memory
    assert all(t > 0 for t in probe.step_seconds)
    assert probe.capacity_bytes > 2**28  # this machine's available memory
    assert limit == 8  # a tiny MLP: the cap, not the memory, limits the group


def test_the_probe_measures_trials_that_use_manual_optimization_on_the_loop():
    from lightning_hydro.demos import DigitsDataModule
    from lightning_hydro.sweeper import ConfigTrainerFactory
    from tests.fused.step.manual_modules import ManualMLP

    _, probe = measure_fusion_limit(
        lambda t: ManualMLP(lr=0.1 * (t + 1), accumulate=1),
        [0, 1],
        datamodule=DigitsDataModule(),
        trainer_factory=ConfigTrainerFactory({"accelerator": "cpu"}),
        safety_margin=0.2,
        max_limit=8,
    )  # vmap, the probe's backend otherwise, refuses manual optimization
    assert all(t > 0 for t in probe.step_seconds)
