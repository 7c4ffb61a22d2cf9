"""Speculative sampling (Leviathan, Kalman & Matias 2023, Algorithm 1) as one jitted loop.

Each iteration of the `lax.while_loop`:

  draft:  gamma proposals per row and their distributions q  (`drafts.Draft`)
  target: ONE cached forward over [last token, proposals] -> p at gamma + 1 positions
  accept: n = accepted prefix length per row (`acceptance.verify`); the token after
          it comes from norm(max(0, p - q)) on a rejection, from p[gamma] otherwise
  write:  n + 1 tokens per row (fewer if EOS or max_decode_len falls inside them)
  rewind: both caches' per-row lengths set to the accepted length; no copies

Every row advances by its own accepted count; finished rows stop changing
while the others go on. At temperature 0, p and q are one-hot and the output is
token for token the target's greedy decoding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax import validation
from specdec_jax.decoding import acceptance
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models import cached_decoder
from specdec_jax.models.t5 import DecoderCache, DecodeWeights, EncodedInputs, T5Model

Array = jax.Array


@struct.dataclass
class SpeculativeStats:
  """Per-row counters of one `speculative_sample` call.

  Attributes:
    iterations: int32 `[batch]`, target calls while the row was unfinished.
    draft_forward_passes: int32 `[batch]`, the draft model's forward passes
      while unfinished (gamma per iteration for a T5 draft; 0 for table
      look-ups: `Draft.forward_passes_per_proposal`).
    tokens: int32 `[batch]`, tokens emitted (the sum of each iteration's;
      equals the output lengths).
    accepted_histogram: int32 `[batch, gamma + 1]`, how often n accepted
      proposals were emitted in one iteration, n = 0..gamma.
    accepted: int32 `[batch]`, accepted proposals that are part of the output
      (S); proposals accepted after an accepted EOS or past max_decode_len
      are not.
    rejections: int32 `[batch]`, iterations whose rejection falls inside the
      output (R): the resampled token was emitted.
    beta_sum: float32 `[batch]`, sum of beta = sum_x min(p(x), q(x)) over the
      verified positions whose token is part of the output (each prefix of
      the output at most once; nothing after the first EOS).
    beta_count: int32 `[batch]`, the number of such positions.
    loop_iterations: int32 `[]`, iterations of the batched loop.
  """

  iterations: Array
  draft_forward_passes: Array
  tokens: Array
  accepted_histogram: Array
  accepted: Array
  rejections: Array
  beta_sum: Array
  beta_count: Array
  loop_iterations: Array

  def alpha_empirical(self) -> Array:
    """`[batch]` acceptance rate S / (S + R): the MLE of alpha under the paper's model."""
    return self.accepted / jnp.maximum(self.accepted + self.rejections, 1)

  def alpha_beta(self) -> Array:
    """`[batch]` the paper's estimator: mean beta over the generated text."""
    return self.beta_sum / jnp.maximum(self.beta_count, 1)

  def tokens_per_iteration(self) -> Array:
    """`[batch]` tokens emitted per target call."""
    return self.tokens / jnp.maximum(self.iterations, 1)


@struct.dataclass
class SpeculativeOutput:
  """Result of `speculative_sample`.

  Attributes:
    sequences: int32 `[batch, max_decode_len]`, generated tokens, EOS included,
      0 after it (the same layout as `baseline.DecodeOutput`).
    lengths: int32 `[batch]`, generated tokens per row, EOS included.
    stats: the `SpeculativeStats`.
    accepted_mask: bool `[batch, max_decode_len]`, True where the token was a
      draft proposal that the target accepted (False: sampled by the target).
  """

  sequences: Array
  lengths: Array
  stats: SpeculativeStats
  accepted_mask: Array


@struct.dataclass
class SpeculativeLoopState:
  """State of the speculative while loop.

  Attributes:
    tokens: int32 `[batch, max_decode_len + gamma + 2]`, the decoder start token
      at index 0, then the generated tokens; beyond a row's length: scratch.
    accepted_mask: bool, same shape: True where the token is an accepted proposal.
    lengths: int32 `[batch]`, m = tokens generated; `tokens[:, m]` is the last
      token, which neither model has processed.
    done: bool `[batch]`, True once a row emitted EOS or reached max_decode_len.
    target_cache: the target's cache; holds exactly m positions per row.
    draft_state: the draft's state (see `drafts.Draft`).
    rng: PRNG key for the remaining iterations.
    stats: running `SpeculativeStats`.
  """

  tokens: Array
  accepted_mask: Array
  lengths: Array
  done: Array
  target_cache: DecoderCache
  draft_state: object
  rng: Array
  stats: SpeculativeStats


def speculative_sample(target: T5Model, target_params: dict, draft: Draft, inputs: Array, *,
                       gamma: int, max_decode_len: int, temperature: float = 0.0,
                       top_k: int = 0, top_p: float = 1.0, eos_id: int | None = None,
                       rng: Array | None = None, draft_inputs: Array | None = None
                       ) -> SpeculativeOutput:
  """Samples from `target` with `draft` proposing `gamma` tokens per target call.

  The output is distributed exactly as `baseline.temperature_sample` on the
  target with the same temperature / top_k / top_p; at temperature 0 it is
  the same tokens.

  Args:
    target: the target model (static).
    target_params: its parameters.
    draft: a `drafts.Draft` with the target's vocabulary.
    inputs: int32 `[batch, input_len]` encoder tokens, 0-padded.
    gamma: proposals per iteration (>= 1).
    max_decode_len: the most tokens to generate per row.
    temperature: 0 for greedy; otherwise the softmax temperature.
    top_k: keep the k most likely tokens (0: all).
    top_p: nucleus mass to keep (1.0: all).
    eos_id: end-of-sequence id (default: the target config's).
    rng: PRNG key (default `PRNGKey(0)`).
    draft_inputs: encoder tokens for the draft if they differ (default `inputs`),
      one row per row of `inputs`.

  Returns:
    A `SpeculativeOutput`.

  Raises:
    ValueError: before any compilation, naming the argument, for a bad one
      (`specdec_jax.validation`): e.g. `gamma=True`, a draft of another
      vocabulary, out-of-vocabulary ids in `inputs` or `draft_inputs`, or
      `draft_inputs` of another batch size. Called under a trace, ids outside
      the vocabulary fail at run time instead (the same ValueError, or a
      `jax.errors.JaxRuntimeError` carrying its message).
  """
  args = validation.check_decode_args(target, inputs, max_decode_len=max_decode_len,
                                      eos_id=eos_id, temperature=temperature, top_k=top_k,
                                      top_p=top_p, rng=rng, model_name="target")
  gamma = validation.as_int("gamma", gamma, minimum=1, what="proposals per target call")
  draft_inputs = validation.check_draft(draft, target.config, args.inputs,
                                        draft_inputs)
  prepared = target.prepare(target_params)  # Once per set of parameters (remembered).
  # The target's encoder runs as its own program (see cached_decoder.COMPILER_OPTIONS).
  return _speculative_sample(target, prepared.decoder, target.encode(prepared, args.inputs),
                             draft, draft_inputs, args.rng, gamma=gamma,
                             max_decode_len=args.max_decode_len,
                             warp=Warp.of(args), eos_id=args.eos_id)


@functools.partial(cached_decoder.loop_jit, static_argnames=(
    "target", "gamma", "max_decode_len", "warp", "eos_id"))
def _speculative_sample(target: T5Model, weights: DecodeWeights, encoded: EncodedInputs,
                        draft: Draft, draft_inputs: Array, rng: Array, *, gamma: int,
                        max_decode_len: int, warp: Warp, eos_id: int) -> SpeculativeOutput:
  """The loop, given the target's prepared weights and encoded inputs."""
  batch = encoded.mask.shape[0]
  cache_len = max_decode_len + gamma + 1
  zeros = jnp.zeros((batch,), jnp.int32)
  buffer = jnp.full((batch, max_decode_len + gamma + 2), target.config.pad_token_id, jnp.int32)
  init = SpeculativeLoopState(
      tokens=buffer.at[:, 0].set(target.config.decoder_start_token_id),
      accepted_mask=jnp.zeros(buffer.shape, bool),
      lengths=zeros,
      done=jnp.zeros((batch,), bool),
      target_cache=target.init_cache(batch, cache_len),
      draft_state=draft.init_state(draft_inputs, cache_len, encoded),
      rng=rng,
      stats=SpeculativeStats(
          iterations=zeros, draft_forward_passes=zeros, tokens=zeros,
          accepted_histogram=jnp.zeros((batch, gamma + 1), jnp.int32), accepted=zeros,
          rejections=zeros, beta_sum=jnp.zeros((batch,), jnp.float32), beta_count=zeros,
          loop_iterations=jnp.array(0, jnp.int32)))

  def cond(state: SpeculativeLoopState) -> Array:
    return ~jnp.all(state.done)

  def body(state: SpeculativeLoopState) -> SpeculativeLoopState:
    return _speculative_step(target, weights, encoded, draft, state, gamma=gamma,
                             max_decode_len=max_decode_len, warp=warp, eos_id=eos_id)

  final = jax.lax.while_loop(cond, body, init)
  valid = jnp.arange(max_decode_len)[None] < final.lengths[:, None]
  sequences = jnp.where(valid, final.tokens[:, 1:max_decode_len + 1], 0)
  accepted_mask = valid & final.accepted_mask[:, 1:max_decode_len + 1]
  return SpeculativeOutput(sequences, final.lengths, final.stats, accepted_mask)


def _write_rows(buffer: Array, chunk: Array, start: Array) -> Array:
  """Writes `chunk [batch, k]` into `buffer [batch, T]` at per-row `start [batch]`."""
  return jax.vmap(lambda b, c, s: jax.lax.dynamic_update_slice(b, c, (s,)))(buffer, chunk, start)


def _speculative_step(target: T5Model, weights: DecodeWeights, encoded: EncodedInputs,
                      draft: Draft, state: SpeculativeLoopState, *, gamma: int,
                      max_decode_len: int, warp: Warp, eos_id: int) -> SpeculativeLoopState:
  """One draft-propose / target-verify / accept / rewind iteration for every row."""
  rng, draft_rng, verify_rng = jax.random.split(state.rng, 3)
  m = state.lengths  # [batch]
  active = ~state.done  # [batch]

  draft_state, proposals, q_logits = draft.propose(
      state.draft_state, state.tokens, m, draft_rng, gamma=gamma, warp=warp)
  last = jnp.take_along_axis(state.tokens, m[:, None], axis=1)  # [batch, 1]
  chunk = jnp.concatenate([last, proposals], axis=1)  # [batch, gamma + 1]
  p_logits, target_cache = target.decode_chunk(weights, encoded, state.target_cache, chunk)
  if warp.temperature == 0:
    verdict = acceptance.verify_greedy(proposals, p_logits)
  else:
    verdict = acceptance.verify(verify_rng, proposals, warp.probs(q_logits), warp.probs(p_logits))
  n = verdict.num_accepted  # [batch]

  # The n accepted proposals, then the next token: n + 1 new tokens per row.
  j = jnp.arange(gamma + 1)[None]  # [1, gamma + 1]
  padded = jnp.pad(proposals, ((0, 0), (0, 1)))
  new = jnp.where(j < n[:, None], padded, verdict.next_token[:, None])  # [batch, gamma + 1]
  # Cut at the first EOS and at max_decode_len.
  is_eos = (new == eos_id) & (j <= n[:, None])
  first_eos = jnp.where(jnp.any(is_eos, 1), jnp.argmax(is_eos, 1), gamma + 1)  # [batch]
  count = jnp.minimum(jnp.minimum(n + 1, first_eos + 1), max_decode_len - m)
  count = jnp.where(active, count, 0)  # [batch]
  new_lengths = m + count
  done = state.done | (first_eos < count) | (new_lengths >= max_decode_len)

  # Everything past a row's new length is scratch (finished rows included): the
  # next write starts there, and the output masks it.
  tokens = _write_rows(state.tokens, new, m + 1)
  accepted_mask = _write_rows(state.accepted_mask, j < n[:, None], m + 1)

  # Statistics count only what the output holds: position j scored new[j],
  # emitted iff j < count (so its context is accepted text before any EOS).
  stats = state.stats
  beta_mask = j[:, :gamma] < count[:, None]  # [batch, gamma]
  emitted_accepted = jnp.minimum(n, count)  # [batch]; 0 for finished rows.
  stats = stats.replace(
      iterations=stats.iterations + active,
      draft_forward_passes=(stats.draft_forward_passes
                            + active * gamma * draft.forward_passes_per_proposal),
      tokens=stats.tokens + count,
      accepted_histogram=stats.accepted_histogram + (
          (jnp.arange(gamma + 1)[None] == emitted_accepted[:, None]) & active[:, None]),
      accepted=stats.accepted + emitted_accepted,
      rejections=stats.rejections + ((n < gamma) & (n < count)),
      beta_sum=stats.beta_sum + jnp.sum(jnp.where(beta_mask, verdict.beta, 0.0), axis=1),
      beta_count=stats.beta_count + jnp.sum(beta_mask, axis=1, dtype=jnp.int32),
      loop_iterations=stats.loop_iterations + 1)

  return SpeculativeLoopState(
      tokens=tokens,
      accepted_mask=accepted_mask,
      lengths=new_lengths,
      done=done,
      target_cache=target_cache.rewind(new_lengths),
      draft_state=draft.commit(draft_state, new_lengths),
      rng=rng,
      stats=stats)
