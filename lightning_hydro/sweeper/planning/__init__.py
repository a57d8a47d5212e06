"""The sweeper's side of a sweep: what runs in the process that Hydra's ``-m`` starts.

It reads ``hydra.sweeper`` (:mod:`.settings`) and the search space (:mod:`.search_space`), asks the samplers
(:mod:`.samplers`, :mod:`.study_channel`) for configurations, plans trial groups (:mod:`.grouping` is the entry:
plain or width-padded groups, capped by the fusion limit of :mod:`.fusion_limit`), deals GPUs to the group jobs
(:mod:`.device_plan`, :mod:`.launch_rules`), keeps the plan for a resume (:mod:`.sweep_state`, :mod:`.sweep_search`)
and writes the results (:mod:`.reports`, :mod:`.plots`). What a job is told is a
:class:`~lightning_hydro.sweeper.group_spec.GroupSpec`; nothing here imports the job's side
(:mod:`lightning_hydro.sweeper.job`).
"""

__all__: list[str] = []
