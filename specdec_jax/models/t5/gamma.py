"""gamma = 'auto' and alpha for a T5 target: `choose_gamma` and `measure_alpha`.

The conveniences over `specdec_jax.costs` and `specdec_jax.gamma_choice` that
take a `T5Model` and its parameters (`speculative_sample`'s arguments), as
T5X keeps each model's glue beside the model:

  choice = choose_gamma(target, target_params, draft, inputs, max_decode_len=64,
                        temperature=1.0)
  print(choice.reason)   # gamma=3: cost model predicts 1.21X (gamma=2: 1.18X, ...
  out = speculative_sample(target, target_params, draft, inputs, gamma=choice.gamma, ...)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import jax

from specdec_jax import costs, distributed, validation
from specdec_jax.decoding import buckets
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.gamma_choice import (
    DEFAULT_CALIBRATION_GAMMA,
    DEFAULT_MAX_GAMMA,
    AlphaEstimate,
    GammaChoice,
    check_alpha,
    pooled_alpha,
)
from specdec_jax.models.t5.generate import speculative_sample
from specdec_jax.models.t5.model import T5Model
from specdec_jax.models.t5.scorer import T5Scorer

Array = jax.Array


def measure_alpha(target: T5Model, target_params: dict, draft: Draft, batches: Sequence[Array],
                  *, gamma: int, max_decode_len: int, warp: Warp, rng: Array) -> AlphaEstimate:
  """alpha from speculative sampling over `batches` (int32 `[b, input_len]` each), no timing.

  Batch i samples with `fold_in(rng, i)`.

  Args:
    target: the target model.
    target_params: its parameters.
    draft: the draft, with the target's vocabulary.
    batches: int32 `[b, input_len]` input batches.
    gamma: the speculative decoder's gamma.
    max_decode_len: the most tokens per row.
    warp: the sampling settings.
    rng: PRNG key; batch i samples with `fold_in(rng, i)`.

  Returns:
    alpha pooled over every row of every batch (`gamma_choice.pooled_alpha`).
  """
  outputs = [distributed.fetch(speculative_sample(
      target, target_params, draft, batch, gamma=gamma, max_decode_len=max_decode_len,
      temperature=warp.temperature, top_k=warp.top_k, top_p=warp.top_p,
      rng=jax.random.fold_in(rng, i)).stats) for i, batch in enumerate(batches)]
  return pooled_alpha(outputs, gamma)


def choose_gamma(target: T5Model, target_params: dict, draft: Draft, inputs: Array, *,
                 max_decode_len: int, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, max_gamma: int = DEFAULT_MAX_GAMMA,
                 alpha: float | None = None,
                 calibration_gamma: int = DEFAULT_CALIBRATION_GAMMA, timing_calls: int = 8,
                 timing_repeats: int = 3, timing_rounds: int = costs.DEFAULT_TIMING_ROUNDS,
                 rng: Array | None = None) -> GammaChoice:
  """Calibrates on `inputs` and returns the gamma the whole cost model predicts to be fastest.

  The T5 convenience (`temperature_sample`'s arguments): times the target's
  T_verify(k) (`costs.verify_times`), then runs `costs.calibrate`, with the
  target's `T5Scorer` and the config's EOS id. Compilation dominates: on the
  2-core CPU, for the shipped family, expect tens of seconds. Time it on a quiet
  machine: the guard is the caller's (`with contention.quiet("calibration") as
  guard:`; `guard.record()` after the block), and `choice.idle_check` is None.

  Args:
    target: the target model.
    target_params: its parameters.
    draft: the draft, with the target's vocabulary.
    inputs: int32 `[batch, input_len]` calibration examples at the batch size
      you will decode with (step costs depend on it): a few suffice.
    max_decode_len: the most tokens per row, as you will decode.
    temperature: the sampling temperature (0 = greedy), as you will decode.
    top_k: as you will decode (0 = off).
    top_p: as you will decode (1.0 = off).
    max_gamma: candidates are gamma = 1..max_gamma.
    alpha: the acceptance rate to decide with, if known (e.g. from the draft's
      model card; the calibration still decodes, to time the loops).
    calibration_gamma: gamma of the calibration's decodings and of the draft
      timing, in 1..max_gamma.
    timing_calls: calls per timed loop.
    timing_repeats: timed runs per loop (the median is used).
    timing_rounds: rounds over every k of T_verify(k) (`costs.verify_times`).
    rng: PRNG key of the calibration's decodings (default `PRNGKey(0)`).

  Returns:
    The `GammaChoice`; `choice.gamma` goes to `speculative_sample(gamma=...)`.

  Raises:
    ValueError: naming the bad argument, before any work.
  """
  args = validation.check_decode_args(target, inputs, max_decode_len=max_decode_len, eos_id=None,
                                      temperature=temperature, top_k=top_k, top_p=top_p,
                                      rng=rng, model_name="target")
  max_gamma = validation.as_int("max_gamma", max_gamma, minimum=1,
                                what="candidates are gamma = 1..max_gamma")
  calibration_gamma = validation.as_int("calibration_gamma", calibration_gamma, minimum=1,
                                        what="gamma of the calibration pass")
  if calibration_gamma > max_gamma:
    raise ValueError(f"calibration_gamma={calibration_gamma} must lie in 1..max_gamma="
                     f"{max_gamma}; lower it or raise max_gamma.")
  if alpha is not None:
    alpha = check_alpha(alpha)
  calls = validation.as_int("timing_calls", timing_calls, minimum=1, what="calls per timed loop")
  repeats = validation.as_int("timing_repeats", timing_repeats, minimum=1,
                              what="timed runs per loop")
  rounds = validation.as_int("timing_rounds", timing_rounds, minimum=1,
                             what="rounds over every k")
  validation.check_draft(draft, target.config.vocab_size, args.inputs, None,
                         target.config.d_model)

  start = time.perf_counter()
  scorer = T5Scorer(target, target.prepare(target_params))
  verify = costs.verify_times(scorer, args.inputs, max_gamma=max_gamma,
                              max_decode_len=args.max_decode_len, calls=calls, repeats=repeats,
                              rounds=rounds)
  choice = costs.calibrate(
      scorer, draft, [buckets.to_bucket(args.inputs)], warp=Warp.of(args),
      max_decode_len=args.max_decode_len, max_gamma=max_gamma, eos_id=args.eos_id,
      rng=args.rng, verify=verify, calibration_gamma=calibration_gamma, timing_calls=calls,
      timing_repeats=repeats, alpha=alpha)
  return dataclasses.replace(choice, calibration_s=time.perf_counter() - start)
