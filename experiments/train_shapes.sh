#!/usr/bin/env bash
# The shared-encoder draft's shape sweep (issue 25): decoders of d_model 128 / 192 / 256 x 1 / 2
# / 3 layers, each trained from scratch on the target's stored signals for the same number of
# steps (gin_configs/train/draft_shared_enc_signals_shape.gin), one after another. Held-out
# alpha is tracked during each run (train.alpha_every_steps); then
#   python -m experiments.alpha_curves --model_dirs=checkpoints/shapes/d128_l1,...
# draws every curve. Each run resumes from its latest checkpoint and finished runs (with a
# train_summary.json) are skipped, so rerunning this script continues where it stopped.
#
#   nohup setsid experiments/train_shapes.sh > checkpoints/shapes.log 2>&1 &
#
# Stop it with `kill -TERM -- -<pid>` (the process group): the running trainer saves a
# checkpoint first; every timing command pauses it meanwhile (it registers itself).
# Environment: CKPT_ROOT (default <repo>/checkpoints), STEPS (default 2000: about 0.8
# passes over the distillation data at batch 64), SHAPES (default: the nine, the shipped
# shape first, then the most telling); extra arguments go to every run.
set -euo pipefail
cd "$(dirname "$0")/.."
source experiments/train_run.sh
CKPT_ROOT="${CKPT_ROOT:-$PWD/checkpoints}/shapes"
STEPS="${STEPS:-2000}"
SHAPES="${SHAPES:-d128_l2 d128_l1 d256_l2 d192_l2 d128_l3 d256_l1 d192_l1 d192_l3 d256_l3}"
mkdir -p "$CKPT_ROOT"

for shape in $SHAPES; do
  if [[ ! "$shape" =~ ^d([0-9]+)_l([0-9]+)$ ]]; then
    echo "$(date -Is) SHAPES: $shape is not d<d_model>_l<layers> (e.g. d192_l2)." >&2
    exit 1
  fi
  d_model="${BASH_REMATCH[1]}"
  layers="${BASH_REMATCH[2]}"
  train_run "$shape ($STEPS steps)" "$CKPT_ROOT/$shape" "$CKPT_ROOT/$shape.log" \
    --gin_file=gin_configs/train/draft_shared_enc_signals_shape.gin \
    --gin.model_config.d_model="$d_model" --gin.model_config.num_decoder_layers="$layers" \
    --gin.train.total_steps="$STEPS" "$@"
done
echo "$(date -Is) trained: $SHAPES."
