"""The modules fused/ had before its regrouping (issue 25) still resolve their names, for one release, with a warning.

Each old module is a stub whose names resolve to the new module with a ``DeprecationWarning`` that names the new
path; the objects are the same (not copies), so ``isinstance`` checks and monkeypatching the new module keep working.
"""

from __future__ import annotations

import importlib

import pytest

# old module (under lightning_hydro.) -> {name: the module (under lightning_hydro.) it lives in now}
OLD_PATHS = {
    "fused.argument_check": {
        "ArgumentCall": "fused.verify.python_arguments",
        "check_python_arguments": "fused.verify.python_arguments",
        "recorded_arguments": "fused.verify.python_arguments",
    },
    "fused.backend_policy": {
        "BackendPolicy": "fused.step.backend_policy",
        "Chooser": "fused.step.backend_policy",
    },
    "fused.callback_view": {
        "TRIAL_CHECKPOINT_KEY": "fused.lightning.callback_view",
        "CallbackTrainerView": "fused.lightning.callback_view",
        "LogBuffer": "fused.lightning.callback_view",
        "TrialCopies": "fused.lightning.callback_view",
        "TrialLogger": "fused.lightning.callback_view",
        "trial_checkpoint": "fused.lightning.callback_view",
    },
    "fused.evaluation_layout": {
        "EvaluationLayout": "fused.evaluation.layout",
    },
    "fused.evaluation_steps": {
        "EvaluationSteps": "fused.evaluation.steps",
        "predictions_by_trial": "fused.evaluation.steps",
    },
    "fused.fused_module": {
        "FusedLightningModule": "fused.module",
    },
    "fused.group_checkpoint": {
        "CHECKPOINT_KEY": "fused.lightning.group_checkpoint",
        "group_checkpoint_for_trial": "fused.lightning.group_checkpoint",
        "group_state": "fused.lightning.group_checkpoint",
        "load_group_checkpoint": "fused.lightning.group_checkpoint",
        "restore_group": "fused.lightning.group_checkpoint",
    },
    "fused.manual_steps": {
        "MANUAL_BACKEND_REASON": "fused.step.manual_steps",
        "ManualStepResult": "fused.step.manual_steps",
        "ManualSteps": "fused.step.manual_steps",
        "choose_loop_for_manual": "fused.step.manual_steps",
    },
    "fused.trainer_view": {
        "TrialTrainerView": "fused.lightning.trainer_view",
        "attach_trainer": "fused.lightning.trainer_view",
        "trial_metrics_view": "fused.lightning.trainer_view",
    },
    "fused.trial_book": {
        "TrialBook": "fused.group.book",
    },
    "fused.trial_callbacks": {
        "CallbackNotPerTrialError": "fused.lightning.callbacks",
        "TrialEarlyStopping": "fused.lightning.early_stopping",
        "TrialLearningRateMonitor": "fused.lightning.learning_rate_monitor",
        "TrialModelCheckpoint": "fused.lightning.model_checkpoint",
        "per_trial_callbacks": "fused.lightning.callbacks",
        "refuse_module_callbacks": "fused.lightning.callbacks",
    },
    "fused.trial_clipping": {
        "clip_trial_gradients": "fused.optimization",
        "custom_clipping": "fused.optimization",
    },
    "fused.trial_hooks": {
        "FORWARDED_HOOKS": "fused.lightning.hooks",
        "OPTIONAL_HOOKS": "fused.lightning.hooks",
        "forward_hook": "fused.lightning.hooks",
        "hide_absent_hooks": "fused.lightning.hooks",
        "record_step_logs": "fused.logging.metrics",
    },
    "fused.trial_metrics": {
        "MetricOptions": "fused.logging.metrics",
        "ReduceFx": "fused.logging.metrics",
        "Reducer": "fused.logging.metrics",
        "TrialMetrics": "fused.logging.metrics",
        "resolve_options": "fused.logging.metrics",
    },
    "fused.trial_model_checkpoint": {
        "TrialModelCheckpoint": "fused.lightning.model_checkpoint",
    },
    "fused.trial_modes": {
        "TrialModes": "fused.evaluation.modes",
    },
    "fused.trial_optimizers": {
        "TrialOptimizers": "fused.optimization",
    },
    "fused.trial_publisher": {
        "LogFunction": "fused.logging.publisher",
        "TrialPublisher": "fused.logging.publisher",
        "chosen_trial": "fused.logging.publisher",
        "record_step_logs": "fused.logging.metrics",
    },
    "fused.trial_roster": {
        "TrialRoster": "fused.roster",
    },
    "fused.trial_schedulers": {
        "drop_scheduler_configs": "fused.optimization",
        "scheduler_configs": "fused.optimization",
    },
    "fused.trial_slots": {
        "TrialSlots": "fused.group.slots",
    },
    "fused.trial_specs": {
        "build_from_spec": "fused.group.specs",
        "module_spec": "fused.group.specs",
        "rebuild_trials": "fused.group.specs",
        "restore_width_scaling": "fused.group.specs",
        "trials_from_configs": "fused.group.specs",
    },
    "fused.trial_strategy": {
        "TrialOptimizerSource": "fused.lightning.strategy_view",
        "TrialStrategyView": "fused.lightning.strategy_view",
        "refuse_inside_vmap": "fused.lightning.strategy_view",
        "scheduler_configs_of": "fused.lightning.strategy_view",
    },
    "fused.width_padding": {
        "width_optimizer_path": "fused.group.width_padding",
    },
    "optim.trial_optimization": {
        "SchedulerSpec": "optim.optimizer_config",
        "TrialOptimization": "optim.optimizer_config",
        "parse_optimizer_config": "optim.optimizer_config",
    },
    "fused.verify": {
        "FusionMismatchError": "fused.verify.fusion",
        "verify_fusion": "fused.verify.fusion",
    },
}

CASES = [(old, name, new) for old, names in OLD_PATHS.items() for name, new in names.items()]


@pytest.mark.parametrize(("old", "name", "new"), CASES, ids=[f"{old}.{name}" for old, name, _ in CASES])
def test_an_old_path_warns_with_the_new_one_and_resolves_to_the_same_object(old, name, new):
    stub = importlib.import_module(f"lightning_hydro.{old}")
    moved_to = importlib.import_module(f"lightning_hydro.{new}")
    message = rf"lightning_hydro\.{old}\.{name} moved to lightning_hydro\.{new}\.{name}; import it from there"
    with pytest.warns(DeprecationWarning, match=message):
        found = getattr(stub, name)
    assert found is getattr(moved_to, name)


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_an_old_module_refuses_a_name_it_never_had(old):
    stub = importlib.import_module(f"lightning_hydro.{old}")
    with pytest.raises(AttributeError, match=rf"module 'lightning_hydro\.{old}' has no attribute 'NoSuchName'"):
        stub.NoSuchName  # noqa: B018


def test_the_fused_package_exports_the_same_objects():
    import lightning_hydro.fused as fused
    from lightning_hydro.fused.module import FusedLightningModule
    from lightning_hydro.fused.verify.fusion import FusionMismatchError

    assert fused.__all__ == ["FusedLightningModule", "FusionMismatchError", "format_results_table"]
    assert fused.FusedLightningModule is FusedLightningModule
    assert fused.FusionMismatchError is FusionMismatchError
