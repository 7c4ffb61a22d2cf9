#!/usr/bin/env bash
# The prepared accelerator check (experiments/device_check.py) as one command:
#
#   bash experiments/device_check.sh OUT_DIR [--smoke] [--budget_s=SECONDS]
#   bash experiments/device_check.sh OUT_DIR --regime_map   # the T5 regime map's sweep
#
# Needs only jax (with CUDA or TPU support), flax, numpy, safetensors and
# sentencepiece; no install: the repository goes on PYTHONPATH. Writes
# OUT_DIR/results.jsonl and OUT_DIR/tables.md (under 8 minutes on one H200).
# PYTHON picks the interpreter (default python3).
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: bash experiments/device_check.sh OUT_DIR [--smoke] [--budget_s=SECONDS]" >&2
  exit 2
fi
out="$1"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="${root}${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python3}" -m experiments.device_check --output_dir="${out}" "$@"
