"""The T5 entry points: `temperature_sample` and `speculative_sample` on a `T5Model`.

Each checks the model, then its arguments against the target's `T5Scorer` as every
family's are checked (`validation.check_scorer_decode_args` /
`check_scorer_speculative_args`; `eos_id=None` is the config's), before any work, and
runs the model-free loop: `decoding.baseline.decode`
(the baseline, one token per step) or `decoding.speculative.speculative_decode`
(gamma proposals per target call), on one device with the inputs cut to a
length bucket (`decoding.buckets`), or with rows split over a mesh's data axis
(`decoding.data_parallel`) when a `mesh` is given.
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh

from specdec_jax import validation
from specdec_jax.decoding import baseline, buckets, data_parallel, speculative
from specdec_jax.decoding.baseline import DecodeOutput
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.speculative import SpeculativeOutput
from specdec_jax.models.t5.cached_decoder import PreparedParams
from specdec_jax.models.t5.config import T5Config
from specdec_jax.models.t5.model import T5Model
from specdec_jax.models.t5.scorer import T5Scorer

Array = jax.Array


def temperature_sample(model: T5Model, params: dict | PreparedParams, inputs: Array, *,
                       max_decode_len: int, temperature: float = 0.0, top_k: int = 0,
                       top_p: float = 1.0, eos_id: int | None = None, rng: Array | None = None,
                       mesh: Mesh | None = None, axis: str = "data") -> DecodeOutput:
  """Samples (or, at temperature 0, greedily decodes) from an encoder-decoder.

  Args:
    model: the model (static: one compiled program per model config).
    params: its parameters, or `model.prepare(params)`.
    inputs: int32 `[batch, input_len]` encoder tokens, 0-padded; on one device
      the padding is cut to a length bucket first (`buckets.to_bucket`).
    max_decode_len: the most tokens to generate per row.
    temperature: 0 for greedy; otherwise the softmax temperature.
    top_k: keep the k most likely tokens (0: all).
    top_p: nucleus mass to keep (1.0: all).
    eos_id: the end-of-sequence id (default: the config's).
    rng: PRNG key (default `PRNGKey(0)`); unused when greedy. With a mesh,
      shard i uses `fold_in(rng, i)`.
    mesh: None (one device), or the device mesh whose `axis` the rows are split
      over (`data_parallel.decode`; the batch must divide by the axis size).
    axis: the mesh's data-parallel axis.

  Returns:
    `DecodeOutput` with `[batch, max_decode_len]` sequences and `[batch]` lengths
    (sharded over `axis` by rows with a mesh).

  Raises:
    ValueError: before any compilation, naming the argument, for a bad one
      (`specdec_jax.validation`): e.g. a non-integral `max_decode_len`, float
      or out-of-vocabulary token ids in `inputs`, or a batch that does not
      split over the mesh. Called under a trace, ids outside the vocabulary
      fail at run time instead (the same ValueError, or a
      `jax.errors.JaxRuntimeError` carrying its message).
  """
  config = validation.check_model(model, "model", T5Config)
  args = validation.check_scorer_decode_args(
      T5Scorer(model, params), inputs, max_decode_len=max_decode_len,
      eos_id=config.eos_token_id if eos_id is None else eos_id, temperature=temperature,
      top_k=top_k, top_p=top_p, rng=rng)
  warp = Warp.of(args)
  if mesh is not None:
    # The parameters are prepared on each shard, inside the program.
    return data_parallel.decode(T5Scorer(model, params), args.inputs, args.rng, mesh=mesh,
                                axis=axis, max_decode_len=args.max_decode_len, warp=warp,
                                eos_id=args.eos_id)
  # Prepared once per set of parameters (remembered), outside the loop's program.
  scorer = T5Scorer(model, model.prepare(params))
  return baseline.decode(scorer, buckets.to_bucket(args.inputs), args.rng,
                         max_decode_len=args.max_decode_len, warp=warp, eos_id=args.eos_id)


def speculative_sample(target: T5Model, target_params: dict | PreparedParams, draft: Draft,
                       inputs: Array, *, gamma: int, max_decode_len: int,
                       temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                       eos_id: int | None = None, rng: Array | None = None,
                       draft_inputs: Array | None = None, mesh: Mesh | None = None,
                       axis: str = "data") -> SpeculativeOutput:
  """Samples from `target` with `draft` proposing `gamma` tokens per target call.

  The output is distributed exactly as `temperature_sample` on the target with
  the same temperature / top_k / top_p; at temperature 0 it is the same tokens.

  Args:
    target: the target model (static).
    target_params: its parameters, or `target.prepare(params)`.
    draft: a `decoding.drafts.Draft` with the target's vocabulary (e.g.
      `make_draft(draft_model, draft_params)`).
    inputs: int32 `[batch, input_len]` encoder tokens, 0-padded; on one device
      the padding is cut to a length bucket first (`buckets.to_bucket`).
    gamma: proposals per iteration (>= 1).
    max_decode_len: the most tokens to generate per row.
    temperature: 0 for greedy; otherwise the softmax temperature.
    top_k: keep the k most likely tokens (0: all).
    top_p: nucleus mass to keep (1.0: all).
    eos_id: end-of-sequence id (default: the target config's).
    rng: PRNG key (default `PRNGKey(0)`). With a mesh, shard i uses
      `fold_in(rng, i)`.
    draft_inputs: encoder tokens for the draft if they differ (default `inputs`),
      one row per row of `inputs`.
    mesh: None (one device), or the device mesh whose `axis` the rows are split
      over (`data_parallel.speculative_decode`; the batch must divide by the
      axis size).
    axis: the mesh's data-parallel axis.

  Returns:
    A `SpeculativeOutput` (sharded over `axis` by rows with a mesh, where
    `stats.loop_iterations` is the largest count of any shard).

  Raises:
    ValueError: before any compilation, naming the argument, for a bad one
      (`specdec_jax.validation`): e.g. `gamma=True`, a draft of another
      vocabulary, out-of-vocabulary ids in `inputs` or `draft_inputs`,
      `draft_inputs` of another batch size, or a batch that does not split
      over the mesh. Called under a trace, ids outside the vocabulary fail at
      run time instead (the same ValueError, or a `jax.errors.JaxRuntimeError`
      carrying its message).
  """
  config = validation.check_model(target, "target", T5Config)
  args = validation.check_scorer_speculative_args(
      T5Scorer(target, target_params), draft, inputs, gamma=gamma, draft_inputs=draft_inputs,
      max_decode_len=max_decode_len, eos_id=config.eos_token_id if eos_id is None else eos_id,
      temperature=temperature, top_k=top_k, top_p=top_p, rng=rng)
  warp = Warp.of(args)
  if mesh is not None:
    # The target's parameters are prepared on each shard, inside the program.
    return data_parallel.speculative_decode(
        T5Scorer(target, target_params), draft, args.inputs, args.rng, mesh=mesh, axis=axis,
        gamma=args.gamma, max_decode_len=args.max_decode_len, warp=warp, eos_id=args.eos_id,
        draft_inputs=args.draft_inputs)
  # Prepared once per set of parameters (remembered), outside the loop's program.
  scorer = T5Scorer(target, target.prepare(target_params))
  return speculative.speculative_decode(
      scorer, draft, buckets.to_bucket(args.inputs), args.rng, gamma=args.gamma,
      max_decode_len=args.max_decode_len, warp=warp, eos_id=args.eos_id,
      draft_inputs=buckets.to_bucket(args.draft_inputs))
