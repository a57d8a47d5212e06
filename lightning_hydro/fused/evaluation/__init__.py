"""Evaluation of a fused group: ``forward``, validation/test/predict steps over every trial.

- :mod:`.steps`: ``EvaluationSteps``, the evaluation methods run fused, or per trial where they cannot be;
- :mod:`.layout`: the evaluation-only stacked state that holds the ended trials too, for test/validate/predict;
- :mod:`.modes`: the trial modules' train/eval modes recorded and restored around evaluation.

Nothing here is public API (users meet it through ``FusedLightningModule``): each name stays in its module.
"""

__all__: list[str] = []
