"""The job's side of a sweep: what runs inside one launched group job.

The launcher runs the user's task function through :mod:`.group_task`, which points the job's ``model`` node at
the group's fused trials (:mod:`.group_model`, :mod:`.sweep_group_module`); or the ready-made
:func:`~lightning_hydro.sweeper.fit_from_config` (:mod:`.fit_from_config`) trains the group with
:func:`~lightning_hydro.sweeper.job.fit_trials.fit_trials`. The job reads its
:class:`~lightning_hydro.sweeper.group_spec.GroupSpec`, builds its early-stopping callback (:mod:`.early_stopping`)
and Trainer (:mod:`.trainer_factory`), joins the sweep-wide search (:mod:`.group_search`), and writes
``group_result.json`` for the sweeper. DDP's re-launched ranks find their group through :mod:`.rank_relaunch`.
"""

__all__: list[str] = []
