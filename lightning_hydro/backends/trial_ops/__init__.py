"""Trial rules: ``torch.nn.functional`` ops run under the fused vmap step as each trial's unfused call runs them.

vmap batches some ops so that they compute otherwise than, or fail where, the same op for one trial does not:
attention (:mod:`.attention`), normalisation (:mod:`.normalization`), linear layers and convolutions with their
bias (:mod:`.projection`) and autocast's precision policy (:mod:`.autocast_policy`).
:func:`~lightning_hydro.backends.trial_ops.functional_patch.trial_functional` installs a rule for each while a
fused step runs (:mod:`.functional_patch` says why there and what it changes). This package module imports
nothing, so that the fused-operator library may use :mod:`.autocast_policy` without an import cycle.
"""
