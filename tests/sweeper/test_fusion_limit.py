import pytest

from lightning_hydro.sweeper.fusion_limit import FusionProbe, fusion_limit_from_probe, measure_fusion_limit

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


def test_the_probe_is_a_seam_until_the_fused_core_lands():
    with pytest.raises(
        NotImplementedError,
        match=r"fusion_limit=auto probes fused training.*set hydra.sweeper.fusion_limit to a number",
    ):
        measure_fusion_limit(
            lambda t: None, [0, 1], datamodule=None, trainer_factory=None, safety_margin=0.2, max_limit=8
        )  # type: ignore[arg-type]
