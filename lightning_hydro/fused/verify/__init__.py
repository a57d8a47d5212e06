"""First-batch verification of a fused group: fusion is verified, not assumed.

- :mod:`.fusion`: each trial's fused loss and gradients compared with its own module's (``verify_fusion``);
- :mod:`.python_arguments`: in training mode, the Python values each trial's code hands to torch compared too.

Until this release ``lightning_hydro.fused.verify`` was one module; its names resolve to :mod:`.fusion` for one
release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

__all__: list[str] = []

__getattr__ = renamed_names(
    __name__,
    {
        **{
            name: Renamed(
                f"lightning_hydro.fused.verify.fusion:{name}",
                f"moved to lightning_hydro.fused.verify.fusion.{name}; import it from there",
            )
            for name in ("FusionMismatchError", "verify_fusion")
        },
        # one function is called differing_attributes (lightning_hydro.backends.hfta.per_trial)
        "differing_attributes": Renamed(
            "lightning_hydro.fused.verify.fusion:_differing_attribute_texts",
            "is removed: use [str(a) for a in lightning_hydro.backends.trial_attributes.scan_attributes(modules, "
            "ids=ids)]",
        ),
    },
)
