"""A draft's distillation step with the target in it, on stored signals, and on-policy.

  python -m benchmarks train_step [--draft=assets/models/draft_shared_enc_long]
      [--batch_size=64] [--batches=8] [--rounds=3] [--output=results/alpha/train_step.json]

Round 2 trained the shared-encoder drafts with the frozen target in every step
(`trainer.make_train_step`: the target's encoder for the student's cross-attention, its
decoder for the logits of the KL term). The step on stored signals
(`sparse_distill.make_signals_train_step`) reads the target's encoder outputs and
top-k log-probabilities from the batch, so only the draft runs. The on-policy step
(`on_policy.make_on_policy_train_step`) samples from the draft and runs the target's
decoder along the samples (total variation, as its recipe). All steps take the same
batches (the first `--batches` of a pass over the stored signals of `--tasks` that exist
now), the same draft, optimizer and loss weights; each round times every batch
through each step, the steps alternating per batch. The first call of each batch shape
is compiled and timed apart. Medians over rounds. Runs inside a `contention.Guard`
(our registered jobs paused; nothing written unless the machine stayed quiet).

Writes one JSON (atomically): steps/s and target tokens/s of each step, the ratio of the
first two,
the guard's record and the environment.
"""

from __future__ import annotations

import datetime
import itertools
import statistics
import time

import jax
import numpy as np
from absl import app, flags

from specdec_jax import atomic_io, contention
from specdec_jax.costs import timing
from specdec_jax.data import teacher_signals
from specdec_jax.models.t5 import T5Model
from specdec_jax.models.t5.checkpoints import load_hf_checkpoint, load_model
from specdec_jax.training import on_policy, optimizer, signals_source, sparse_distill, trainer

_DRAFT = flags.DEFINE_string("draft", "assets/models/draft_shared_enc_long",
                             "A shared-encoder draft (its shape and weights).")
_TARGET = flags.DEFINE_string("target", "assets/models/target", "The target (teacher).")
_TASKS = flags.DEFINE_list("tasks", ["ende"], "Corpora whose signals are read.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 64, "Rows per batch.", lower_bound=1)
_BATCHES = flags.DEFINE_integer("batches", 8, "Batches timed per round.", lower_bound=1)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed rounds (median used).", lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", "results/alpha/train_step.json", "The JSON written.")

# Both steps train with the recipe of gin_configs/train/draft_shared_enc_signals.gin.
LOSS = trainer.LossConfig(distill_weight=0.5, distill_divergence="forward_kl")
# gin_configs/train/draft_shared_enc_signals_on_policy.gin's teacher term.
ON_POLICY_LOSS = trainer.LossConfig(distill_weight=1.0, distill_divergence="total_variation")
OLD_KEYS = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
            "decoder_loss_weights")


def _available_shards(tasks: list[str]):
  """The joined distillation + signals shards written so far (an unfinished run too)."""
  for task in tasks:
    yield from teacher_signals.iter_joined(task, require_complete=False)


def measure() -> dict:
  """Times both steps on the same batches; returns the JSON record."""
  data = signals_source.PackedSignals.from_shards(_available_shards(_TASKS.value))
  source = signals_source.SignalsBatches(data, batch_size=_BATCH_SIZE.value, seed=0)
  batches = list(itertools.islice(source.batches(), _BATCHES.value))
  draft, params = load_model(_DRAFT.value, dropout_rate=0.0)
  target_cfg, target_params = load_hf_checkpoint(_TARGET.value, dropout_rate=0.0)
  target = T5Model(target_cfg)
  target_params = jax.device_put(target_params)
  tx = optimizer.Optimizer(kind="adafactor", clip_norm=0.0).build(
      optimizer.LearningRate(peak_lr=1e-3).schedule(1000))
  old_step = trainer.make_train_step(draft, tx, LOSS, target)
  new_step = sparse_distill.make_signals_train_step(draft, tx, LOSS)
  policy_step = on_policy.make_on_policy_train_step(draft, target, tx, ON_POLICY_LOSS)
  rng = jax.random.PRNGKey(0)
  states = {name: trainer.TrainState.create(jax.device_put(params), tx)
            for name in ("target_in_step", "stored_signals", "on_policy")}

  def run(name: str, batch: dict) -> float:
    start = time.perf_counter()
    if name == "target_in_step":
      states[name], metrics = old_step(states[name], {k: batch[k] for k in OLD_KEYS}, rng,
                                       target_params)
    elif name == "stored_signals":
      states[name], metrics = new_step(states[name], batch, rng)
    else:
      states[name], metrics = policy_step(states[name], batch, rng, target_params)
    jax.block_until_ready(metrics)
    return time.perf_counter() - start

  first = {name: sum(run(name, b) for b in batches) for name in states}  # Compiles.
  rounds: dict[str, list[float]] = {name: [] for name in states}
  with contention.quiet("benchmark_train_step") as guard:
    for r in range(_ROUNDS.value):
      totals = dict.fromkeys(states, 0.0)
      for i, batch in enumerate(batches):
        for name in timing.rotated(list(states), r + i):
          totals[name] += run(name, batch)
      for name, total in totals.items():
        rounds[name].append(total)
  tokens = sum(int(np.sum(b["decoder_loss_weights"])) for b in batches)
  steps = {}
  for name, times in rounds.items():
    median = statistics.median(times)
    steps[name] = {"seconds_per_step": median / len(batches),
                   "steps_per_s": len(batches) / median,
                   "target_tokens_per_s": tokens / median,
                   "round_seconds": times,
                   "first_round_s_with_compilation": first[name]}
  return {
      "what": "one optimizer step of the shared-encoder draft: the target in the step "
              "(round 2), the target's stored signals, and on-policy (the draft's samples "
              "scored by the target's decoder in the step)",
      "command": "python -m benchmarks train_step",
      "draft": _DRAFT.value, "target": _TARGET.value, "batch_size": _BATCH_SIZE.value,
      "batches": _BATCHES.value, "rounds": _ROUNDS.value, "target_tokens": tokens,
      "batch_shapes": [[list(b["encoder_input_tokens"].shape),
                        list(b["decoder_target_tokens"].shape)] for b in batches],
      "pairs_available": data.num_pairs,
      "top_k": data.top_k, "loss": {"distill_weight": LOSS.distill_weight,
                                    "distill_divergence": LOSS.distill_divergence},
      "on_policy_loss": {"distill_divergence": ON_POLICY_LOSS.distill_divergence},
      "steps": steps,
      "speedup": steps["stored_signals"]["steps_per_s"] / steps["target_in_step"]["steps_per_s"],
      "idle_check": guard.record(), "environment": timing.environment(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
  }


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  record = measure()
  atomic_io.write_json(_OUTPUT.value, record)
  for name, s in record["steps"].items():
    print(f"{name}: {s['steps_per_s']:.2f} steps/s ({1e3 * s['seconds_per_step']:.0f} ms a "
          f"step of {record['batch_size']}), {s['target_tokens_per_s']:.0f} target tokens/s")
  print(f"stored signals: {record['speedup']:.1f}X the steps per second. Wrote {_OUTPUT.value}.")
