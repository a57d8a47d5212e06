#!/usr/bin/env bash
# Issue 22's GPU checks in one call on a lent GPU machine: the GPU tests, then gpu_fusion.py's cells in order of
# what they decide, every stage capped so that the whole run ends inside BUDGET seconds, output written as it goes.
#
# Here, once (the GPU image lacks hydra-core, omegaconf, antlr4, mup, optuna):
#     bash ../shared/device/prepare-wheels.sh                      # writes .whl/
# Then, through the device tool (no kind named; ~9 minutes of device time with the start):
#     run(command="bash benchmarks/device_check.sh", carry=[".whl"], timeout_s=540)
# What comes back under $OUT (at most 8 files): env.txt, tests.txt and tests_compile.txt (pytest -m gpu, with --durations),
# update.md (benchmarks/compiled_update_check.py: which fused updates compile right here), whole.md
# (benchmarks/whole_step_check.py: each model's first three compiled whole steps against eager),
# bench.md (the table, a line per cell as measured), bench.log (the cells' errors), stages.txt (what ran, what
# was skipped for time). Rerun one stage alone: STAGES="bench" bash benchmarks/device_check.sh
#
# On a machine without CUDA it checks itself: `bash benchmarks/device_check.sh --cpu` runs every stage at tiny
# sizes on the CPU (the gpu tests then skip), so that a broken stage is found before device time is spent.
set -u
cd "$(dirname "$0")/.."
CPU=0
[ "${1:-}" = "--cpu" ] && CPU=1
OUT=${OUT:-$(mktemp -d)}
BUDGET=${BUDGET:-480}
STAGES=${STAGES:-"tests bench"}
START=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONFAULTHANDLER=1

left() { echo $((BUDGET - ($(date +%s) - START))); }
log() { echo "$(date -u +%H:%M:%S) +$(($(date +%s) - START))s $*" | tee -a "$OUT/stages.txt" >&2; }

# run CAP SECONDS_RESERVED_AFTER NAME COMMAND...: the command under `timeout`, at most CAP seconds and never into
# the time the later stages reserve
run_capped() {
  local cap=$1 reserve=$2 name=$3
  shift 3
  local t
  t=$(($(left) - reserve))
  [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt 20 ]; then
    log "skipped $name: $(left) s left"
    return 0
  fi
  log "start $name (at most $t s)"
  timeout -k 10 "$t" "$@"
  local rc=$?
  log "end $name: rc=$rc$([ $rc -eq 124 ] && echo ' (cut at its cap)')"
}

if [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1; then
  SITE=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl \
    || log "wheel install failed"
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2> /dev/null || echo "no nvidia-smi"
  python3 -c "import torch, lightning, torchmetrics; print('torch', torch.__version__, 'lightning', lightning.__version__,
'torchmetrics', torchmetrics.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
  python3 -c "import hydra, mup, optuna, lightning_hydro; print('hydra', hydra.__version__, 'lightning_hydro imports')"
  nproc
} > "$OUT/env.txt" 2>&1

if [[ " $STAGES " == *" tests "* ]]; then
  # correctness first. The compile tests run in a process of their own, beside the rest of the gpu suite: on the
  # first H200 run (2026-11-27) a crash in them (a segfault under CUDA graphs) took the suite's other files with it.
  # PYTHONFAULTHANDLER prints the Python stack of such a crash.
  tests=(tests/fused/step/test_host_syncs.py tests/gpu/test_gpu_exactness.py tests/gpu/test_gpu_checkpoints.py
    tests/gpu/test_gpu_attention.py tests/gpu/test_gpu_precision.py tests/demos/test_digits_resnet.py
    tests/sweeper/test_shared_gpu.py)
  run_capped 220 220 "pytest -m gpu (compile)" python3 -m pytest -m gpu -p no:cacheprovider -q \
    -rfEsxX --durations=10 --timeout 150 tests/gpu/test_gpu_compile.py > "$OUT/tests_compile.txt" 2>&1 &
  # which fused updates compile right on this device, and which inductor setting fixes Adam's (COMPILED_ON)
  small=()
  [ "$CPU" = 1 ] && small=(--small --variants default no-lerp)
  whole=()
  [ "$CPU" = 1 ] && whole=(--models mlp-sgd cnn-adam --clip 0)
  {
    run_capped 150 220 "compiled update check" python3 benchmarks/compiled_update_check.py ${small[@]+"${small[@]}"} \
      --optimizers sgd-momentum adam adamw > "$OUT/update.md" 2>&1
    # the first three compiled whole steps against the same step run eagerly, per model (what the library's check measures)
    run_capped 90 220 "whole step check" python3 benchmarks/whole_step_check.py ${whole[@]+"${whole[@]}"} \
      > "$OUT/whole.md" 2>&1
  } &
  run_capped 220 220 "pytest -m gpu" python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs \
    --durations=20 --timeout 120 "${tests[@]}" > "$OUT/tests.txt" 2>&1
  wait
fi

if [[ " $STAGES " == *" bench "* ]]; then
  if [ "$CPU" = 1 ]; then
    common=(--device cpu --small --steps 3 --warmup 2 --profile-steps 1 --threads 1 --cell-timeout 120)
  else
    common=(--steps 30 --warmup 10 --profile-steps 3 --cell-timeout 150)
  fi
  bench() { # NAME CAP RESERVE ARGS...: one invocation of gpu_fusion.py, its lines appended to bench.md
    local name=$1 cap=$2 reserve=$3
    shift 3
    echo "<!-- $name: python benchmarks/gpu_fusion.py ${common[*]} $* -->" >> "$OUT/bench.md"
    run_capped "$cap" "$reserve" "bench $name" python3 benchmarks/gpu_fusion.py "${common[@]}" "$@" \
      --output "$OUT/bench_$name.tmp" >> "$OUT/bench.md" 2>> "$OUT/bench.log"
    rm -f "$OUT/bench_$name.tmp"
  }
  # item 2's aim at B = 16 (MLP eager <= 5.6 ms, against concurrent processes and the raw floors; lightning-floor:
  # the raw step under Lightning's loop, which splits the gap to the raw floor into Lightning's part and ours)
  bench mlp16 160 150 --models mlp --trials 16 --precision 32-true \
    --rows concurrent fused-vmap lightning-floor raw-eager raw-graphs
  # item 3's (the whole step <= 2.3 ms with CUDA graphs): the MLP with SGD, whose compiled update is right on CUDA
  bench mlp-sgd16 110 120 --models mlp-sgd --trials 16 --precision 32-true \
    --rows fused-vmap fused-vmap-compile fused-vmap-graphs raw-graphs
  # ResNet-18 and the Transformer at B = 16 (compiled <= 22 ms, >= 2x concurrent processes; <= 39 ms)
  bench resnet16 110 50 --models resnet18 --trials 16 --precision 32-true \
    --rows concurrent fused-vmap fused-vmap-compile raw-eager
  bench transformer16 80 20 --models transformer --trials 16 --precision 32-true \
    --rows concurrent fused-vmap fused-vmap-compile
  # item 4 (a group of one against a plain run) and B = 4 / 64, with whatever time is left
  bench mlp1-4-64 200 0 --models mlp --trials 1 4 64 --precision 32-true \
    --rows sequential concurrent fused-auto fused-vmap fused-vmap-graphs
fi
log "done"
ls -la "$OUT" >> "$OUT/stages.txt"
