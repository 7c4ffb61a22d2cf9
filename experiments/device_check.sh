#!/usr/bin/env bash
# The prepared accelerator check (experiments/device_check.py) as one command:
#
#   bash experiments/device_check.sh OUT_DIR [--gin_file=...] [--gin.X=V ...]
#   bash experiments/device_check.sh OUT_DIR --regime_map   # the T5 regime map's sweep
#
# Needs jax (with CUDA or TPU support), flax, numpy, safetensors, sentencepiece, gin-config
# and tqdm; no install: the repository goes on PYTHONPATH, and so does every wheel in WHEELS
# (default <repo>/.whl), so that pure-Python packages a machine lacks travel as wheels:
#   pip download --no-deps --only-binary=:all: gin-config tqdm -d .whl
# Writes OUT_DIR/checks.json, OUT_DIR/tables.md and a folder of rows per run (under 8
# minutes on one H200). PYTHON picks the interpreter (default python3).
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: bash experiments/device_check.sh OUT_DIR [--gin_file=FILE] [--gin.X=V] [--regime_map]" >&2
  exit 2
fi
mkdir -p "$1"
out="$(cd "$1" && pwd)"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
path="${root}"
for wheel in "${WHEELS:-${root}/.whl}"/*.whl; do
  [[ -e "${wheel}" ]] && path="${path}:${wheel}"
done
export PYTHONPATH="${path}${PYTHONPATH:+:${PYTHONPATH}}"
cd "${root}"  # Gin files and the models are read from the repository (relative paths too).
exec "${PYTHON:-python3}" -m experiments.device_check --output_dir="${out}" "$@"
