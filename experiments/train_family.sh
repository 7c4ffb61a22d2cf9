#!/usr/bin/env bash
# Trains the model family in order: target, the three drafts, then the draft distilled
# from the target. Each run resumes from its latest checkpoint; finished runs (those with
# a train_summary.json) are skipped, so rerunning this script continues where it stopped.
# Members already shipped in assets/models/ are skipped too (RETRAIN_SHIPPED=1 trains
# them anyway), so a fresh machine trains only what is missing.
#
#   nohup setsid experiments/train_family.sh > checkpoints/family.log 2>&1 &
#
# Stop it with `kill -TERM -- -<pid>` (the process group): the running trainer saves a
# checkpoint first. Environment: CKPT_ROOT (default <repo>/checkpoints); extra arguments
# are passed to every run (e.g. --gin.train.log_every=10); MEMBERS (default: the whole
# family, in the order above) picks which members to train and in what order.
set -euo pipefail
cd "$(dirname "$0")/.."
source experiments/train_run.sh
CKPT_ROOT="${CKPT_ROOT:-$PWD/checkpoints}"
mkdir -p "$CKPT_ROOT"

MEMBERS="${MEMBERS:-target draft_small draft_base draft_large draft_distilled}"
for name in $MEMBERS; do
  if [[ ! -f "gin_configs/train/$name.gin" ]]; then
    echo "$(date -Is) MEMBERS: no gin_configs/train/$name.gin; use names from" \
      "gin_configs/train/." >&2
    exit 1
  fi
  dir="$CKPT_ROOT/$name"
  if [[ -f "assets/models/$name/config.json" && ! -f "$dir/train_summary.json"
        && "${RETRAIN_SHIPPED:-0}" != 1 ]]; then
    echo "$(date -Is) $name: shipped in assets/models, skipping (RETRAIN_SHIPPED=1 retrains)."
    continue
  fi
  extra=()
  if [[ "$name" == draft_distilled ]]; then
    teacher="$CKPT_ROOT/target/hf"  # float32; else the shipped float16 copy.
    [[ -f "$teacher/model.safetensors" ]] || teacher="$PWD/assets/models/target"
    if [[ ! -f "$teacher/model.safetensors" ]]; then
      echo "$(date -Is) $name: needs the trained target ($CKPT_ROOT/target/hf or" \
        "assets/models/target); stopping." >&2
      exit 1
    fi
    extra=("--gin.train.teacher_dir='$teacher'")
  fi
  train_run "$name" "$dir" "$CKPT_ROOT/$name.log" --gin_file="gin_configs/train/$name.gin" \
    "${extra[@]}" "$@"
done
echo "$(date -Is) trained: $MEMBERS."
