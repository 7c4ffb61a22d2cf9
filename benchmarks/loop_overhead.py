r"""What each decoding loop itself costs, at batch 1: per speculative iteration, per baseline token.

One iteration = the draft's gamma proposals + one target verification of
gamma + 1 tokens + the loop's own work (rejection rule, writing the accepted
tokens, rewinding both caches, statistics). The first two are timed on their
own inside jitted loops (`timing.draft_token_time`,
`timing.target_step_times`); the iteration is timed inside
`speculative_sample` (its total minus both encoders, over its loop iterations).
The remainder is the loop's overhead. The baseline's is the same account per
token: `temperature_sample`'s time per token (less the target's encoder) minus
the one-token step T_step. Calls are interleaved and medians taken.

  python -m benchmarks loop_overhead --gammas=3,5 --gin.Settings.input_len=32 \
      --output=results/loop_overhead/results.json

The generation and input lengths are the shared `Settings` (gin).

Random-init models of the given shapes by default; `--target_dir` / `--draft_dir`
time HF-format checkpoints instead (e.g. assets/models/target and
assets/models/draft_small).
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specdec_jax import atomic_io, contention
from specdec_jax.costs import timing
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.experiment import gin_flags, settings
from specdec_jax.models.t5 import (
  T5Model,
  T5Scorer,
  get_config,
  make_draft,
  speculative_sample,
  temperature_sample,
)
from specdec_jax.models.t5.checkpoints import load_hf_checkpoint, load_model

_TARGET = flags.DEFINE_string("target_config", "t5-v1_1-small", "Named config of the target.")
_TARGET_DIR = flags.DEFINE_string("target_dir", None,
                                  "HF-format target checkpoint (replaces --target_config).")
_DRAFT_DIR = flags.DEFINE_string("draft_dir", None, "HF-format draft checkpoint (replaces "
                                 "--draft_d_model / --draft_layers).")
_DRAFT_D_MODEL = flags.DEFINE_integer("draft_d_model", 128, "d_model of the draft.",
                                      lower_bound=1)
_DRAFT_LAYERS = flags.DEFINE_integer("draft_layers", 2, "Encoder and decoder layers of the draft.",
                                     lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab_size", 8192, "Vocabulary of both models (prompts use ids "
                              ">= 2).", lower_bound=3)
_GAMMAS = flags.DEFINE_list("gammas", ["3", "5"], "Proposals per iteration to measure.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Interleaved timed repetitions.", lower_bound=1)
flags.register_validator("gammas", lambda gammas: bool(gammas) and all(
    g.isdecimal() and int(g) >= 1 for g in gammas), "--gammas must list ints >= 1, e.g. 3,5.")
flags.register_validator("temperature", lambda t: math.isfinite(t) and t >= 0,
                         "--temperature must be a finite number >= 0 (0 = greedy).")
_OUTPUT = flags.DEFINE_string("output", "results/loop_overhead/results.json",
                              "JSON file written atomically.")
parse_flags = gin_flags.parse_flags  # `python -m benchmarks` parses with it.


def _models() -> tuple[T5Model, dict, Draft]:
  if _TARGET_DIR.value:
    cfg, params = load_hf_checkpoint(_TARGET_DIR.value, dropout_rate=0.0)
    target = T5Model(cfg)
  else:
    target = T5Model(get_config(_TARGET.value, vocab_size=_VOCAB.value, dropout_rate=0.0))
    params = target.init_params(jax.random.PRNGKey(0))
  if _DRAFT_DIR.value:
    draft_model, draft_params = load_model(_DRAFT_DIR.value, dropout_rate=0.0)
  else:
    draft_model = T5Model(get_config(
        "t5-v1_1-small", vocab_size=_VOCAB.value, d_model=_DRAFT_D_MODEL.value,
        num_layers=_DRAFT_LAYERS.value, num_decoder_layers=_DRAFT_LAYERS.value,
        num_heads=max(_DRAFT_D_MODEL.value // 64, 1), d_ff=2 * _DRAFT_D_MODEL.value,
        dropout_rate=0.0))
    draft_params = draft_model.init_params(jax.random.PRNGKey(1))
  if draft_model.config.vocab_size != target.config.vocab_size:
    raise app.UsageError(f"The draft's vocabulary ({draft_model.config.vocab_size}) differs "
                         f"from the target's ({target.config.vocab_size}); pair models that "
                         "share one.")
  # As a user holds them: the target's weights prepared once (`T5Model.prepare`).
  return (target, target.prepare(jax.device_put(params)),
          make_draft(draft_model, jax.device_put(draft_params)))


def measure_gamma(target: T5Model, params: dict, draft: Draft, inputs: jax.Array,
                  gamma: int, max_len: int) -> dict:
  """Times one gamma: iteration, its parts, and the remainder (the loop's overhead)."""
  warp = Warp(_TEMPERATURE.value)
  cache_len = max_len + gamma + 1
  position = max_len // 2  # Attention spans the cache either way; a typical length.
  # eos_id = pad id 0 is never the argmax of these models in practice (random ones,
  # or trained ones that never emit padding), so every call runs max_decode_len
  # tokens; the stats below confirm it.
  spec = lambda: speculative_sample(target, params, draft, inputs, gamma=gamma,
                                    max_decode_len=max_len, temperature=_TEMPERATURE.value,
                                    eos_id=0)
  scorer = T5Scorer(target, target.prepare(params))
  target_encoded = timing.target_encoded_for(draft, scorer, inputs)

  def encode() -> tuple:
    context = scorer.encode(inputs)
    return context, draft.init_state(inputs, cache_len, scorer.encoder_outputs(context))

  out = spec()
  iterations = int(out.stats.loop_iterations)
  spec_s, encode_s, verify_s, draft_s, pair_s = [], [], [], [], []
  for _ in range(_REPEATS.value):
    spec_s.append(timing.timed(spec)[0])
    encode_s.append(timing.timed(encode)[0])
    verify_s.append(timing.target_step_times(
        scorer, inputs, chunk_lengths=[gamma + 1], cache_len=cache_len, position=position,
        calls=16, repeats=1)[gamma + 1].seconds)
    draft_s.append(gamma * timing.draft_token_time(
        draft, inputs, gamma=gamma, warp=warp, cache_len=cache_len, position=position,
        calls=16, repeats=1, target_encoded=target_encoded).seconds)
    pair_s.append(timing.propose_verify_time(
        scorer, draft, inputs, gamma=gamma, warp=warp, cache_len=cache_len, position=position,
        calls=16, repeats=1).seconds)
  iteration = (statistics.median(spec_s) - statistics.median(encode_s)) / iterations
  verify, propose = statistics.median(verify_s), statistics.median(draft_s)
  overhead = iteration - verify - propose
  pair = statistics.median(pair_s)
  return {
      "gamma": gamma,
      "loop_iterations": iterations,
      "tokens": int(np.asarray(out.lengths)[0]),
      "iteration_ms": 1e3 * iteration,
      "draft_propose_ms": 1e3 * propose,
      "target_verify_ms": 1e3 * verify,
      "overhead_ms": 1e3 * overhead,
      "overhead_share": overhead / iteration,
      "pair_ms": 1e3 * pair,
      "interference_ms": 1e3 * (pair - verify - propose),
      "bookkeeping_ms": 1e3 * (iteration - pair),
      "speculative_call_ms": [1e3 * s for s in spec_s],
      "encode_ms": [1e3 * s for s in encode_s],
  }


def measure_baseline(target: T5Model, params: dict, inputs: jax.Array, max_len: int) -> dict:
  """Times the baseline per token: its total less the encoder, and the one-token step."""
  base = lambda: temperature_sample(target, params, inputs, max_decode_len=max_len, eos_id=0)
  encode = lambda: target.encode(params, inputs)
  scorer = T5Scorer(target, target.prepare(params))
  tokens = int(np.asarray(base().lengths)[0])
  base_s, encode_s, step_s = [], [], []
  for _ in range(_REPEATS.value):
    base_s.append(timing.timed(base)[0])
    encode_s.append(timing.timed(encode)[0])
    step_s.append(timing.target_step_times(
        scorer, inputs, chunk_lengths=[1], cache_len=max_len + 1, position=max_len // 2,
        calls=16, repeats=1)[1].seconds)
  per_token = (statistics.median(base_s) - statistics.median(encode_s)) / tokens
  step = statistics.median(step_s)
  return {"tokens": tokens, "token_ms": 1e3 * per_token, "step_ms": 1e3 * step,
          "overhead_ms": 1e3 * (per_token - step), "baseline_call_ms": [1e3 * t for t in base_s],
          "encode_ms": [1e3 * t for t in encode_s]}


def _measure(shared: settings.Settings) -> dict:
  """This process's measurement: the baseline and every gamma, each under the guard."""
  target, params, draft = _models()
  inputs = jnp.asarray(np.random.RandomState(0).randint(
      2, target.config.vocab_size, size=(1, shared.input_len)), jnp.int32)
  with contention.quiet("loop_overhead baseline") as guard:
    baseline = measure_baseline(target, params, inputs, shared.max_decode_len)
  baseline["idle_check"] = guard.record()
  print(f"baseline: {baseline['token_ms']:.2f} ms per token = step {baseline['step_ms']:.2f} "
        f"+ loop {baseline['overhead_ms']:.2f} ms")
  rows = []
  for gamma in (int(g) for g in _GAMMAS.value):
    with contention.quiet(f"benchmark_loop_overhead gamma={gamma}") as guard:
      row = measure_gamma(target, params, draft, inputs, gamma, shared.max_decode_len)
    rows.append({**row, "idle_check": guard.record()})
    print(f"gamma={gamma}: iteration {row['iteration_ms']:.2f} ms = draft "
          f"{row['draft_propose_ms']:.2f} + verify {row['target_verify_ms']:.2f} + loop "
          f"{row['overhead_ms']:.2f} ms ({100 * row['overhead_share']:.1f}% overhead; "
          f"{row['loop_iterations']} iterations, {row['tokens']} tokens)")
    print(f"  draft + verify back to back {row['pair_ms']:.2f} ms: the two together "
          f"{row['interference_ms']:+.2f} ms over their sum, the loop's bookkeeping "
          f"{row['bookkeeping_ms']:.2f} ms")
  return {
      "target_config": _TARGET_DIR.value or _TARGET.value,
      "draft": _DRAFT_DIR.value or {"d_model": _DRAFT_D_MODEL.value,
                                    "layers": _DRAFT_LAYERS.value},
      "vocab_size": target.config.vocab_size, "batch": 1, "temperature": _TEMPERATURE.value,
      "max_decode_len": shared.max_decode_len, "input_len": shared.input_len,
      "repeats": _REPEATS.value, "baseline": baseline, "rows": rows,
      "environment": timing.environment(),
  }


def main(argv: Sequence[str]) -> None:
  del argv
  shared = gin_flags.load_settings(gin_flags.GIN_FILE.value, gin_flags.GIN_BINDINGS.value)
  result = _measure(shared)
  os.makedirs(os.path.dirname(os.path.abspath(_OUTPUT.value)), exist_ok=True)
  atomic_io.write_json(_OUTPUT.value, result)
  print(f"wrote {_OUTPUT.value}")
