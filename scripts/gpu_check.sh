#!/usr/bin/env bash
# scripts/gpu_check.sh [--dry-run] [OUTDIR]: the GPU paths run and measured in one go, in < 8 minutes.
#
# On a machine with one CUDA GPU and no network: the GPU-only tests, the benchmarks on cuda at the
# README's COCO sizes (with peak memory; captioning-train end to end at the training benchmark's
# shape, compiled and eager), the evaluation of 5,000 items at COCO size (fp32 and bf16), and the real
# CLIs on the embedded shapes data (extraction and bf16-mixed training on the GPU, the GPU checkpoint
# evaluated on the CPU and on the GPU, then self-critical training, compiled), then the extraction
# with PIL decoding for comparison and the extraction/evaluation targets (gpu_check.py targets).
# Every figure is one JSON line of OUTDIR/figures.jsonl, tagged with the GPU's name;
# OUTDIR (default gpu-check/) ends with 7 files: figures.jsonl, summary.json and the logs
# setup.log, tests.log, bench.log, pipeline.log, compile.log.
#
# Stages run most valuable first, each under `timeout` (its box, cut to what is left of the whole
# budget GPU_CHECK_BUDGET_S, default 470 s); a failed stage is recorded and the next one runs, a
# stage whose input failed is skipped.  Exit: 0 every stage ok; 1 a stage failed, timed out or was
# skipped; 2 bad arguments; 3 no CUDA device visible (nothing measured, figures.jsonl says so).
# --dry-run prints each stage, its box and its commands without running them (tests/test_gpu_check.py).
#
# What it needs beyond the GPU machine's own packages (torch, lightning, timm, pytest, ...) travels
# as wheels in .whl/ (hydra-core, omegaconf, antlr4, pycocotools, av): `make gpu-wheels` here, with
# the network.  The project itself runs from the copied tree (PYTHONPATH, `python3 -m captioning.cli.*`).
# The device tool's call:
#   run(command='bash scripts/gpu_check.sh "$OUT"', carry=[".whl"], timeout_s=560)
# Locally, on a CUDA machine with the project installed: `make gpu-check` (OUTDIR gpu-check/).
set -uo pipefail

usage() { sed -n '2,3p' "${BASH_SOURCE[0]}" | sed 's/^# //'; }

DRY_RUN=0
OUT=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "error: unknown option $arg" >&2; usage >&2; exit 2 ;;
    *) if [[ -n "$OUT" ]]; then echo "error: one OUTDIR only (got $OUT and $arg)" >&2; exit 2; fi
       OUT="$arg" ;;
  esac
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 2
PY="${PYTHON:-python3}"
OUT="${OUT:-gpu-check}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)" || exit 2
FIG="$OUT/figures.jsonl"
: >"$FIG"
WORK="${GPU_CHECK_WORK:-/tmp/captioning-gpu-check}"  # data, features, runs: not copied back
SITE="${GPU_CHECK_SITE:-/tmp/captioning-gpu-site}"   # the wheels of .whl/, installed here
BUDGET_S="${GPU_CHECK_BUDGET_S:-470}"
MIN_STAGE_S=15  # a stage needs at least this much of the budget left to start
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
DEADLINE=$((START + BUDGET_S))
LAST_SECONDS=0

# The embedded data and the training budget (the model is conf/model/soft_attention.yaml's).
N_IMAGES=640   # 512 train images x 5 captions = 40 batches of 64: no smaller last batch to recompile for
EPOCHS=3
DATA=(data=shapes "data.root=$WORK/shapes" "data.num_items=$N_IMAGES" data.batch_size=64 data.num_workers=4)
QUIET=(trainer.enable_progress_bar=false)
TRAIN=(optim.lr=1e-3 optim.warmup_steps=10 logger=csv callbacks.progress=null callbacks.attention_images=null
       callbacks.early_stopping=null trainer.log_every_n_steps=5 "${QUIET[@]}")
EVAL=(split=test decode=greedy "metrics=[bleu,rouge,cider]" num_workers=2 grounding=false "${QUIET[@]}")
BENCH=("$PY" -m captioning_bench.cli)

# stage NAME BOX LOG CMD...: run CMD under `timeout` (BOX s, or what is left of the budget), its output
# appended to OUTDIR/LOG; one JSON line records status, exit code and seconds.  Returns CMD's status.
stage() {
  local name="$1" box="$2" log="$3" rc status t0 secs left limit
  shift 3
  left=$((DEADLINE - $(date +%s)))
  limit=$((left < box ? left : box))
  printf '== stage %s (box %s s)\n+ %s\n' "$name" "$box" "$(printf '%q ' "$@")"
  if ((DRY_RUN)); then
    "$PY" scripts/gpu_check.py stage "$FIG" "$name" dry-run 0 0 "$box" -- "$@"
    return 0
  fi
  if ((left < MIN_STAGE_S)); then
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

"$PY" scripts/gpu_check.py device "$FIG" $( ((DRY_RUN)) && echo --dry-run)
rc=$?
if ((rc == 3)); then exit 3; fi
if ((rc != 0)); then echo "error: the device probe failed (rc $rc)" >&2; exit 1; fi
if ((!DRY_RUN)); then  # a second run starts afresh (training would resume from the last one)
  rm -rf "$WORK"/{shapes,train-gpu,train-compile,eval-cpu,eval-gpu-fp32,eval-gpu-bf16,hydra,tests.xml,scale}
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

# 1. the GPU-only tests (bf16 autocast, decoding on the device, the API, the fused kernels)
stage tests 150 tests.log "$PY" -m pytest -q -rA -m gpu -p no:cacheprovider --junitxml="$WORK/tests.xml" \
  tests/test_gpu.py tests/test_device_decode.py
[[ -f "$WORK/tests.xml" ]] || ((DRY_RUN)) && stage tests-figures 15 tests.log \
  "$PY" scripts/gpu_check.py tests "$WORK/tests.xml" "$FIG"

# 2. the benchmarks at the README's COCO sizes (196 x 2048 annotations, 512-d, vocab 10k, 20 words)
stage bench-train 90 bench.log "${BENCH[@]}" train --device cuda --output "$FIG"
stage bench-train-fp32 60 bench.log "${BENCH[@]}" train --device cuda --amp off --steps 10 --output "$FIG"
# the default training (compile=auto: compiled, CUDA graphs) end to end: captioning-train on a synthetic
# dataset of the benchmark's COCO shape, its steady-state steps/s beside the benchmark's compiled step and the
# tutorial's (train/cli_vs_baseline: target 10x; train/cli_vs_ours: 0.9), then the same CLI eager
stage bench-train-cli 240 bench.log "${BENCH[@]}" train --device cuda --compile --cli --cli-workers 8 --steps 10 \
  --output "$FIG"
stage bench-train-cli-eager 90 bench.log "${BENCH[@]}" train --device cuda --cli --cli-workers 8 --cli-epochs 1 \
  --steps 5 --output "$FIG"
stage bench-beam 90 bench.log "${BENCH[@]}" beam --device cuda --repeats 3 --output "$FIG"
stage bench-train-b128 60 bench.log "${BENCH[@]}" train --device cuda --batch-size 128 --steps 5 \
  --skip-baseline --output "$FIG"
stage bench-extract-images 120 bench.log "${BENCH[@]}" extract-images --device cuda --weights none \
  --output "$FIG"

# 2b. evaluation at COCO size: captioning-evaluate of 5,000 test items (beam 3, BLEU/ROUGE-L/CIDEr-D, a
#     random-weight decoder of the default size; the 10k-word vocabulary of 10k train items' captions) on a
#     synthetic 14x14x512 store of 10k train + 5k val + 5k test items, with the decode/score/write split,
#     in fp32 then bf16 (their captions compared)
SCALE=("${BENCH[@]}" scale --device cuda --items 10000 --eval-items 5000 --root "$WORK/scale" --disk-write-gb 0.5
       --eval-metrics bleu,rouge,cider --output "$FIG")
if stage bench-scale-eval 150 bench.log "${SCALE[@]}" --skip disk,annotations,decoder,loader,memory,ddp,extract; then
  if stage bench-scale-eval-bf16 60 bench.log "${SCALE[@]}" --eval-precision bf16 \
       --skip build,disk,annotations,decoder,loader,memory,ddp,extract; then
    stage compare-scale-bf16 15 bench.log "$PY" scripts/gpu_check.py compare "$WORK/scale/eval/fp32" \
      "$WORK/scale/eval/bf16" "$FIG" --label scale_fp32_vs_bf16
  else
    skip compare-scale-bf16
  fi
else
  skip bench-scale-eval-bf16 compare-scale-bf16
fi

# 3. the CLIs: shapes -> GPU extraction -> bf16-mixed training -> the GPU checkpoint evaluated on
#    the CPU (CUDA hidden) and on the GPU in fp32 (the default: captions must be identical) and in bf16
#    (precision=bf16: recorded)
CKPT="$WORK/train-gpu/checkpoints/last.ckpt"
if stage generate 60 pipeline.log "$PY" -m captioning.cli.generate dataset=shapes "root=$WORK/shapes" \
     "num_items=$N_IMAGES" "hydra.run.dir=$WORK/hydra/generate" &&
   stage extract 90 pipeline.log "$PY" -m captioning.cli.extract "${DATA[@]}" encoder=efficientnet_lite0 \
     encoder.weights=none trainer=gpu batch_size=64 "hydra.run.dir=$WORK/hydra/extract" "${QUIET[@]}"; then
  if stage train-gpu 150 pipeline.log "$PY" -m captioning.cli.train "${DATA[@]}" trainer=gpu compile=false \
       "trainer.max_epochs=$EPOCHS" "${TRAIN[@]}" "hydra.run.dir=$WORK/train-gpu"; then
    stage train-gpu-figures 15 pipeline.log "$PY" scripts/gpu_check.py train "$WORK/train-gpu" "$FIG" \
      --label bf16_mixed --seconds "$LAST_SECONDS"
    stage eval-cpu 90 pipeline.log env CUDA_VISIBLE_DEVICES= "$PY" -m captioning.cli.evaluate \
      "ckpt_path=$CKPT" trainer=cpu "${EVAL[@]}" "output_dir=$WORK/eval-cpu" "hydra.run.dir=$WORK/hydra/eval-cpu"
    stage eval-gpu-fp32 60 pipeline.log "$PY" -m captioning.cli.evaluate "ckpt_path=$CKPT" trainer=gpu \
      "${EVAL[@]}" "output_dir=$WORK/eval-gpu-fp32" "hydra.run.dir=$WORK/hydra/eval-gpu-fp32"
    stage eval-gpu-bf16 60 pipeline.log "$PY" -m captioning.cli.evaluate "ckpt_path=$CKPT" trainer=gpu \
      precision=bf16 "${EVAL[@]}" "output_dir=$WORK/eval-gpu-bf16" "hydra.run.dir=$WORK/hydra/eval-gpu-bf16"
    stage compare-fp32 15 pipeline.log "$PY" scripts/gpu_check.py compare "$WORK/eval-cpu" \
      "$WORK/eval-gpu-fp32" "$FIG" --label cpu_vs_gpu_fp32 --identical
    stage compare-bf16 15 pipeline.log "$PY" scripts/gpu_check.py compare "$WORK/eval-cpu" \
      "$WORK/eval-gpu-bf16" "$FIG" --label cpu_vs_gpu_bf16
  else
    skip train-gpu-figures eval-cpu eval-gpu-fp32 eval-gpu-bf16 compare-fp32 compare-bf16
  fi
else
  skip train-gpu train-gpu-figures eval-cpu eval-gpu-fp32 eval-gpu-bf16 compare-fp32 compare-bf16
fi

# 4. self-critical training from the bf16 checkpoint, compile=auto (its sampling one compiled graph, CUDA
#    graphs): steady-state steps/s from the steps' wall times (the compiled XE training is bench-train-cli)
SCST_RUN="$WORK/train-scst"
if [[ -f "$CKPT" ]] || ((DRY_RUN)); then
  ((DRY_RUN)) || rm -rf "$SCST_RUN"
  if stage train-scst 200 compile.log "$PY" -m captioning.cli.train "${DATA[@]}" trainer=gpu stage=scst \
       "init_from=$CKPT" data.batch_size=16 trainer.max_epochs=1 "${TRAIN[@]}" \
       "+callbacks.clock._target_=captioning_bench.train_cli.StepClock" "+callbacks.clock.path=$SCST_RUN/clock.json" \
       "hydra.run.dir=$SCST_RUN"; then
    stage train-scst-figures 15 compile.log "$PY" scripts/gpu_check.py clock "$SCST_RUN/clock.json" "$FIG" \
      --label scst_compile_auto
  else
    skip train-scst-figures
  fi
else
  skip train-scst train-scst-figures
fi

# 5. the extraction job with PIL decoding in the workers (what nvjpeg replaced), then the issue-41 targets
stage bench-extract-images-pil 90 bench.log "${BENCH[@]}" extract-images --device cuda --weights none \
  --jpeg-decoder pil --output "$FIG"
stage targets 15 bench.log "$PY" scripts/gpu_check.py targets "$FIG"

echo "== $(($(date +%s) - START)) s in all"
"$PY" scripts/gpu_check.py finish "$FIG" "$OUT/summary.json"
