# Sourced by train_family.sh and train_shapes.sh: one resumable run of experiments.train.
#
# train_run NAME DIR LOG ARGS...
#   Skips a run that finished earlier (DIR/train_summary.json); stops if a trainer already
#   runs on DIR; else trains with ARGS and --model_dir=DIR, appending to LOG, and fails if
#   the trainer fails or stops before it finishes (rerun the caller to resume).
train_run() {
  local name="$1" dir="$2" log="$3"
  shift 3
  if [[ -f "$dir/train_summary.json" ]]; then
    echo "$(date -Is) $name: finished earlier, skipping."
    return 0
  fi
  if pgrep -f -- "--model_dir=$dir( |\$)" > /dev/null; then
    echo "$(date -Is) $name: a trainer is already running on $dir; stopping." >&2
    exit 1
  fi
  echo "$(date -Is) $name: training (log $log)."
  local status=0
  python -m experiments.train --model_dir="$dir" "$@" >> "$log" 2>&1 || status=$?
  if [[ "$status" -ne 0 ]]; then
    echo "$(date -Is) $name: failed (exit $status); see $log." >&2
    exit "$status"
  fi
  if [[ ! -f "$dir/train_summary.json" ]]; then
    echo "$(date -Is) $name: stopped before finishing (signal?); rerun to resume." >&2
    exit 1
  fi
}
