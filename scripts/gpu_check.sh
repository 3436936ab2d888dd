#!/usr/bin/env bash
# scripts/gpu_check.sh [--dry-run] train|extract [OUTDIR]: the GPU paths of training or of extraction, run
# and measured in one call of at most 5 minutes each (270 s of stages; the rest is the device's start-up).
#
# train: the GPU-only tests of training (bf16 autocast, the fused kernels, decoding, the API), the
#   training CLI against the benchmark's compiled step (captioning-bench train --compile --cli), the real
#   CLIs on the embedded shapes data (extraction, bf16-mixed training on the GPU, the GPU checkpoint
#   evaluated on the CPU and on the GPU in fp32: their captions must be identical), then self-critical
#   training (compile=auto), and the training targets.
# extract: the GPU-only tests of decoding on the device (nvJPEG's pixels within their bounds, decoding
#   ahead equal to a synchronous decode over many batches, the job equal to a synchronous run), the
#   extraction job at steady state against the slowest of decode, forward and write alone (nvJPEG; then
#   with torchvision's decoder), the store writer against a plain write of the same bytes on the disk
#   and on tmpfs, the video extraction job, and the extraction targets.
# Every figure is one JSON line of OUTDIR/figures.jsonl, tagged with the GPU's name; OUTDIR (default
# gpu-check/<call>/) ends with figures.jsonl, summary.json and the logs of its stages.
#
# Stages run most valuable first (those that measure open targets), each under `timeout` (its box, cut
# to what is left of the budget GPU_CHECK_BUDGET_S, default 270 s); a failed stage is recorded and the
# next one runs, a stage whose input failed is skipped; the targets stage always runs.  Exit: 0 every
# stage ok; 1 a stage failed, timed out or was skipped; 2 bad arguments; 3 no CUDA device visible
# (nothing measured, figures.jsonl says so).  --dry-run prints each stage, its box and its commands
# without running them (tests/test_gpu_check.py).
#
# What it needs beyond the GPU machine's own packages (torch, lightning, timm, pytest, ...) travels
# as wheels in .whl/ (hydra-core, omegaconf, antlr4, pycocotools, av): `make gpu-wheels` here, with
# the network.  The project itself runs from the copied tree (PYTHONPATH, `python3 -m captioning.cli.*`).
# The device tool's calls (15 minutes of device time cover both, start-up included):
#   run(command='bash scripts/gpu_check.sh train "$OUT"', carry=[".whl"], timeout_s=300)
#   run(command='bash scripts/gpu_check.sh extract "$OUT"', carry=[".whl"], timeout_s=300)
# Locally, on a CUDA machine with the project installed: `make gpu-check` (both calls).
set -uo pipefail

usage() { sed -n '2,3p' "${BASH_SOURCE[0]}" | sed 's/^# //'; }

DRY_RUN=0
CALL=""
OUT=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "error: unknown option $arg" >&2; usage >&2; exit 2 ;;
    train | extract) if [[ -z "$CALL" ]]; then CALL="$arg"; elif [[ -z "$OUT" ]]; then OUT="$arg"; else
        echo "error: one OUTDIR only (got $OUT and $arg)" >&2; exit 2; fi ;;
    *) if [[ -z "$CALL" ]]; then echo "error: the first argument is the call: train or extract (got $arg)" >&2
         usage >&2; exit 2; fi
       if [[ -n "$OUT" ]]; then echo "error: one OUTDIR only (got $OUT and $arg)" >&2; exit 2; fi
       OUT="$arg" ;;
  esac
done
if [[ -z "$CALL" ]]; then echo "error: name the call: train or extract" >&2; usage >&2; exit 2; fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 2
PY="${PYTHON:-python3}"
OUT="${OUT:-gpu-check/$CALL}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)" || exit 2
FIG="$OUT/figures.jsonl"
: >"$FIG"
WORK="${GPU_CHECK_WORK:-/tmp/captioning-gpu-check}"  # data, features, runs: not copied back
SITE="${GPU_CHECK_SITE:-/tmp/captioning-gpu-site}"   # the wheels of .whl/, installed here
BUDGET_S="${GPU_CHECK_BUDGET_S:-270}"
MIN_STAGE_S=15  # a stage needs at least this much of the budget left to start
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
DEADLINE=$((START + BUDGET_S))
LAST_SECONDS=0

# The embedded data and the training budget (the model is conf/model/soft_attention.yaml's).
N_IMAGES=320   # 256 train images x 5 captions = 20 batches of 64: no smaller last batch to recompile for
EPOCHS=1
DATA=(data=shapes "data.root=$WORK/shapes" "data.num_items=$N_IMAGES" data.batch_size=64 data.num_workers=4)
QUIET=(trainer.enable_progress_bar=false)
TRAIN=(optim.lr=1e-3 optim.warmup_steps=10 logger=csv callbacks.progress=null callbacks.attention_images=null
       callbacks.early_stopping=null trainer.log_every_n_steps=5 "${QUIET[@]}")
EVAL=(split=test decode=greedy "metrics=[bleu,rouge,cider]" num_workers=2 grounding=false "${QUIET[@]}")
BENCH=("$PY" -m captioning_bench.cli)

# stage NAME BOX LOG CMD...: run CMD under `timeout` (BOX s, or what is left of the budget), its output
# appended to OUTDIR/LOG; one JSON line records status, exit code and seconds.  Returns CMD's status.
# FINAL=1 stage ...: the same, whatever is left of the budget (a stage of a few seconds that must run).
stage() {
  local name="$1" box="$2" log="$3" rc status t0 secs left limit
  shift 3
  left=$((DEADLINE - $(date +%s)))
  limit=$((left < box ? left : box))
  if ((${FINAL:-0})); then limit=$box; fi
  printf '== stage %s (box %s s)\n+ %s\n' "$name" "$box" "$(printf '%q ' "$@")"
  if ((DRY_RUN)); then
    "$PY" scripts/gpu_check.py stage "$FIG" "$name" dry-run 0 0 "$box" -- "$@"
    return 0
  fi
  if ((left < MIN_STAGE_S)) && ((!${FINAL:-0})); then
    echo "   skipped: ${left} s of the ${BUDGET_S} s budget left"
    "$PY" scripts/gpu_check.py stage "$FIG" "$name" skipped -1 0 "$box" -- "$@"
    return 1
  fi
  printf '\n===== %s: %s\n' "$name" "$*" >>"$OUT/$log"
  t0=$(date +%s.%N)
  timeout --kill-after=10 "$limit" "$@" >>"$OUT/$log" 2>&1
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  LAST_SECONDS=$secs
  case $rc in 0) status=ok ;; 124 | 137) status=timeout ;; *) status=failed ;; esac
  echo "   $status (rc $rc, $secs s)"
  "$PY" scripts/gpu_check.py stage "$FIG" "$name" "$status" "$rc" "$secs" "$box" -- "$@"
  return $rc
}

# skip NAME...: record stages not run because a stage they need did not finish ok
skip() {
  local name
  for name in "$@"; do
    echo "== stage $name: skipped (its input failed)"
    "$PY" scripts/gpu_check.py stage "$FIG" "$name" skipped -1 0 0 -- needs an earlier stage
  done
}

# gpu_tests NAME FILE...: the GPU-only tests of FILEs, then one figure line per test
gpu_tests() {
  local name="$1"
  shift
  stage "$name" 60 tests.log "$PY" -m pytest -q -rA -m gpu -p no:cacheprovider --junitxml="$WORK/$name.xml" "$@"
  [[ -f "$WORK/$name.xml" ]] || ((DRY_RUN)) && stage "$name-figures" 15 tests.log \
    "$PY" scripts/gpu_check.py tests "$WORK/$name.xml" "$FIG"
}

"$PY" scripts/gpu_check.py device "$FIG" $( ((DRY_RUN)) && echo --dry-run)
rc=$?
if ((rc == 3)); then exit 3; fi
if ((rc != 0)); then echo "error: the device probe failed (rc $rc)" >&2; exit 1; fi
if ((!DRY_RUN)); then  # a second run starts afresh (training would resume from the last one)
  rm -rf "$WORK"/{shapes,train-gpu,train-scst,eval-cpu,eval-gpu-fp32,hydra,*.xml,scale-write}
  mkdir -p "$WORK"
fi

# 0. the wheels this machine lacks (only when an import fails: a project venv has them all)
if ((DRY_RUN)) || ! "$PY" -c "import hydra, omegaconf, pycocotools, av" 2>/dev/null; then
  compgen -G "$REPO/.whl/*.whl" >/dev/null || ((DRY_RUN)) ||
    echo "error: no wheels in $REPO/.whl: run 'make gpu-wheels' where PyPI is reachable and carry .whl" >&2
  stage setup 60 setup.log "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE" "$REPO"/.whl/*.whl
  export PYTHONPATH="$REPO:$SITE${PYTHONPATH#"$REPO"}"
fi

train_call() {
  # 1. the GPU-only tests of training (bf16 autocast, the fast step, decoding on the device, the input path)
  gpu_tests tests-train tests/test_gpu.py
  # 2. the default training (compile=auto: compiled, CUDA graphs; per-image batches; the store resident on the
  #    GPU) as a user runs it: captioning-train with its default callbacks on a synthetic 14x14x512 dataset, an
  #    epoch of 1,000 steps, its steady-state steps/s beside the benchmark's compiled step and the tutorial's
  #    (train/cli_vs_ours: 0.9; train/cli_vs_baseline: 10x), with its loader alone and its loop alone
  stage bench-train-cli 120 bench.log "${BENCH[@]}" train --device cuda --compile --cli --cli-workers 8 --steps 10 \
    --feature-dim 512 --cli-epochs 1 --cli-steps 1000 --output "$FIG"
  # 3. the CLIs on shapes: GPU extraction -> bf16-mixed training -> self-critical training from its checkpoint
  #    (compile=auto: its sampling one compiled graph, CUDA graphs; steady-state steps/s from the steps' wall
  #    times) -> the checkpoint evaluated on the CPU (CUDA hidden) and on the GPU in fp32: identical captions
  local ckpt="$WORK/train-gpu/checkpoints/last.ckpt"
  if stage generate 20 pipeline.log "$PY" -m captioning.cli.generate dataset=shapes "root=$WORK/shapes" \
       "num_items=$N_IMAGES" "hydra.run.dir=$WORK/hydra/generate" &&
     stage extract 30 pipeline.log "$PY" -m captioning.cli.extract "${DATA[@]}" encoder=efficientnet_lite0 \
       encoder.weights=none trainer=gpu batch_size=64 "hydra.run.dir=$WORK/hydra/extract" "${QUIET[@]}" &&
     stage train-gpu 45 pipeline.log "$PY" -m captioning.cli.train "${DATA[@]}" trainer=gpu compile=false \
       "trainer.max_epochs=$EPOCHS" "${TRAIN[@]}" "hydra.run.dir=$WORK/train-gpu"; then
    stage train-gpu-figures 15 pipeline.log "$PY" scripts/gpu_check.py train "$WORK/train-gpu" "$FIG" \
      --label bf16_mixed --seconds "$LAST_SECONDS"
  else
    skip train-gpu-figures
  fi
  if [[ -f "$ckpt" ]] || ((DRY_RUN)); then
    if stage train-scst 60 compile.log "$PY" -m captioning.cli.train "${DATA[@]}" trainer=gpu stage=scst \
         "init_from=$ckpt" data.batch_size=16 trainer.max_epochs=1 "${TRAIN[@]}" \
         "+callbacks.clock._target_=captioning_bench.train_cli.StepClock" \
         "+callbacks.clock.path=$WORK/train-scst/clock.json" "hydra.run.dir=$WORK/train-scst"; then
      stage train-scst-figures 15 compile.log "$PY" scripts/gpu_check.py clock "$WORK/train-scst/clock.json" "$FIG" \
        --label scst_compile_auto
    else
      skip train-scst-figures
    fi
    if stage eval-cpu 30 pipeline.log env CUDA_VISIBLE_DEVICES= "$PY" -m captioning.cli.evaluate \
         "ckpt_path=$ckpt" trainer=cpu "${EVAL[@]}" "output_dir=$WORK/eval-cpu" "hydra.run.dir=$WORK/hydra/eval-cpu" &&
       stage eval-gpu-fp32 25 pipeline.log "$PY" -m captioning.cli.evaluate "ckpt_path=$ckpt" trainer=gpu \
         "${EVAL[@]}" "output_dir=$WORK/eval-gpu-fp32" "hydra.run.dir=$WORK/hydra/eval-gpu-fp32"; then
      stage compare-fp32 15 pipeline.log "$PY" scripts/gpu_check.py compare "$WORK/eval-cpu" \
        "$WORK/eval-gpu-fp32" "$FIG" --label cpu_vs_gpu_fp32 --identical
    else
      skip compare-fp32
    fi
  else
    skip train-scst train-scst-figures eval-cpu eval-gpu-fp32 compare-fp32
  fi
  # 4. the training CLI at the COCO shape 14x14x2048 (a 400-step epoch) when time is left
  stage bench-train-cli-2048 90 bench.log "${BENCH[@]}" train --device cuda --compile --cli --cli-workers 8 \
    --steps 10 --cli-epochs 1 --cli-steps 400 --output "$FIG"
}

extract_call() {
  # 1. the GPU-only tests of decoding on the device (bounds, decoding ahead, the job against a synchronous run)
  gpu_tests tests-extract tests/test_device_decode.py
  # 2. the extraction job at steady state (>= 20 s) against the slowest of decode, forward and write alone,
  #    nvJPEG on the device (EfficientNet-Lite0, 224 px, 640x480 JPEGs, random weights)
  stage bench-extract-images 100 bench.log "${BENCH[@]}" extract-images --device cuda --weights none \
    --part-seconds 3 --skip-fold --output "$FIG"
  # 3. the store writer against a plain sequential write of the same bytes: on this machine's disk, then tmpfs
  local scale=("${BENCH[@]}" scale --device cuda --root "$WORK/scale-write" --write-items 6000 --write-repeats 3
               --skip build,disk,annotations,decoder,loader,memory,ddp,evaluate,extract --output "$FIG")
  stage bench-store-write-disk 30 bench.log "${scale[@]}" --write-root "$WORK/scale-write/disk"
  stage bench-store-write-tmpfs 20 bench.log "${scale[@]}" --write-root /dev/shm/captioning-gpu-check-write
  # 4. the video extraction job against its parts (decoding in the workers)
  stage bench-extract-videos 45 bench.log "${BENCH[@]}" extract-videos --device cuda --weights none \
    --num-videos 64 --batch-size 8 --workers 8 --output "$FIG"
  # 5. the same image job with torchvision's batched decoder (which library measures faster)
  stage bench-extract-images-torchvision 40 bench.log "${BENCH[@]}" extract-images --device cuda --weights none \
    --jpeg-library torchvision --part-seconds 2 --min-seconds 8 --skip-fold --output "$FIG"
}

if [[ "$CALL" == train ]]; then train_call; else extract_call; fi
FINAL=1 stage targets 15 bench.log "$PY" scripts/gpu_check.py targets "$FIG" --call "$CALL"

echo "== $(($(date +%s) - START)) s in all"
"$PY" scripts/gpu_check.py finish "$FIG" "$OUT/summary.json"
