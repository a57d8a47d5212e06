"""The steady training step of a fused group: one optimizer step of B trials, in the order it runs.

Lightning's automatic optimization drives the step; the fused module's hooks hand each stage to a module here
(the universal path, each trial's own optimizer, lives in :mod:`lightning_hydro.optim.group_optimizer`):

1. :mod:`.training_step` (``FusedLightningModule.training_step``): the backend runs every trial's own
   ``training_step`` in one call; what the trials logged is booked per trial; :mod:`.row_health` records which
   of the ``[B]`` losses are not finite; the sum of the finite ones goes to Lightning's backward, which leaves
   each trial's gradient in its row of the stacked gradients.
2. ``configure_gradient_clipping``: ``Trainer(gradient_clip_val=...)`` clips each row by its own norm in one pass
   (:meth:`.fused_update.FusedUpdate.clip_norm`, asked by the group optimizer), and the norms are kept: they
   tell the next stage which rows are not finite.
3. ``TrialGroupOptimizer.step`` hands :mod:`.fused_update` the rows :mod:`.row_health` says to skip (a non-finite
   loss, or a divergence not read back yet); it adds the rows with non-finite gradients and runs a few
   ``torch._foreach_*`` calls over the stacked ``[B, ...]`` tensors, each hyperparameter a ``[B, 1, ...]`` factor
   (copied to the device by :mod:`.row_hyperparameters` only when a scheduler or the user changed one), the
   skipped rows' factors made neutral on the device. What runs only on change lives beside it:
   :mod:`.update_plan` (the parameters grouped into parts), :mod:`.update_rows` (a row's state in and out of
   torch's per-trial format), :mod:`.select_update` (which update fits the trials' optimizers).
4. :mod:`.row_health` (``optimizer_step``) absorbs the step's report on the device, and at the batch's end says
   whether to read it back: on a schedule (optimizer steps 1, 2, 4, ..., then every 32 on an accelerator, every
   step on the CPU), at epoch ends and before slot changes; the fused module's roster frees diverged trials' slots
   then (:mod:`lightning_hydro.fused.roster`).
5. With ``compile=``: a steady step runs stages 1-3 as one compiled function, :mod:`.whole_step` (``"reduce-overhead"``:
   one CUDA graph on a GPU): stage 1 hands it the backend's call, and stages 2 and 3 only report what it did. Where
   it would not compute the same (its ``usable`` says why), the stages run apart, each compiled without CUDA
   graphs: :mod:`lightning_hydro.backends.compiled_step` (stage 1's forward and backward) and
   :mod:`.compiled_update` (stage 3's device work, its first step per update checked against eager).

Which backend stage 1 runs, and how ``backend="auto"`` chooses it and the first batch is verified, is
:mod:`.backend_policy`'s business. Trials that use manual optimization run :mod:`.manual_steps` instead: each
trial's own ``training_step`` on the loop, stepping its own optimizers.

No stage reads a value back to the host or copies one from it, unless a hyperparameter changed (then one
non-blocking copy from pinned memory): ``tests/fused/step/test_host_syncs.py`` counts both on the CPU, and checks
the same cases under CUDA's sync debug mode on a GPU. The one exception is where a read waits for nothing: on the
CPU read back every step (the default there), stage 1 reads the loss sum and stage 3 the gradients' total, and a
step with no bad row leaves the masking of bad rows out (``tests/fused/step/test_cpu_reads.py``).

Nothing here is public API (users meet it through ``FusedLightningModule``): each name stays in its module.
"""

__all__: list[str] = []
