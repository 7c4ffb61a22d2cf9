"""Speculative sampling (Leviathan, Kalman & Matias 2023, Algorithm 1) as one jitted loop.

Each iteration of the `lax.while_loop`:

  draft:  gamma proposals per row and their distributions q  (`drafts.Draft`)
  target: ONE scored chunk [last token, proposals] -> p at gamma + 1 positions
          (`scorer.Scorer.score`; the baseline scores a chunk of one token per step)
  accept: n = accepted prefix length per row (`acceptance.verify`); the token after
          it comes from norm(max(0, p - q)) on a rejection, from p[gamma] otherwise
  write:  n + 1 tokens per row (fewer if EOS or max_decode_len falls inside them)
  rewind: both caches' per-row lengths set to the accepted length; no copies

A draft that reads the target's features (`Draft.reads_target_features`, EAGLE-style)
gets them where the target computes them anyway: its prompt's from the target's
prefill (`Scorer.init_state_with_features`), and each verified chunk's from the same
scoring call (`Scorer.score_with_features`, passed to `Draft.commit`); the rule that
accepts is unchanged.

Every row advances by its own accepted count; finished rows stop changing
while the others go on. At temperature 0, p and q are one-hot and the output is
token for token the target's greedy decoding.

`speculative_decode` takes any `Scorer` as the target and any `Draft` (and the
acceptance rule, for tests); it imports no model. `models.t5.speculative_sample`
is `speculative_decode` with a `T5Scorer` as the target.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax import stats
from specdec_jax.decoding import acceptance, programs
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import Scorer

Array = jax.Array


@struct.dataclass
class SpeculativeStats:
  """Per-row counters of one `speculative_decode` call.

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

  # Per row, on the host (numpy `[batch]`), by the definitions in `specdec_jax.stats`;
  # `stats.Pooled` gives the same figures over many rows and calls.

  def alpha_empirical(self) -> np.ndarray:
    """`[batch]` acceptance rate S / (S + R): the MLE of alpha under the paper's model."""
    return stats.alpha_empirical(self.accepted, self.rejections)

  def alpha_beta(self) -> np.ndarray:
    """`[batch]` the paper's estimator: mean beta over the generated text."""
    return stats.alpha_beta(self.beta_sum, self.beta_count)

  def tokens_per_iteration(self) -> np.ndarray:
    """`[batch]` tokens emitted per target call."""
    return stats.tokens_per_call(self.tokens, self.iterations)


@struct.dataclass
class SpeculativeOutput:
  """Result of `speculative_decode`.

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
class IterationRecords:
  """What each iteration of the loop did, per row (the statistics are reduced after the loop).

  Attributes:
    accepted: int32 `[batch, max_decode_len]`, n = proposals the rule accepted
      at iteration i (column i); 0 for iterations not run.
    emitted: int32 `[batch, max_decode_len]`, tokens the row emitted at
      iteration i (0 once the row is finished).
    beta_sum: float32 `[batch, max_decode_len]`, the sum of beta over the
      verified positions whose token was emitted at iteration i; at
      temperature 0 it follows from `accepted` and `emitted` and is `[batch, 0]`.
  """

  accepted: Array
  emitted: Array
  beta_sum: Array


@struct.dataclass
class SpeculativeLoopState:
  """State of the speculative while loop.

  Attributes:
    iteration: int32 `[]`, iterations run so far.
    tokens: int32 `[batch, max_decode_len + gamma + 2]`, the decoder start token
      at index 0, then the generated tokens; beyond a row's length: scratch.
    lengths: int32 `[batch]`, m = tokens generated; `tokens[:, m]` is the last
      token, which neither model has processed.
    done: bool `[batch]`, True once a row emitted EOS or reached max_decode_len.
    target_state: the target scorer's state; its cache holds exactly m
      positions per row.
    draft_state: the draft's state (see `drafts.Draft`).
    rng: PRNG key for the remaining iterations (unused at temperature 0).
    records: the `IterationRecords` so far.
  """

  iteration: Array
  tokens: Array
  lengths: Array
  done: Array
  target_state: object
  draft_state: object
  rng: Array
  records: IterationRecords


def speculative_decode(target: Scorer, draft: Draft, inputs: Array, rng: Array, *, gamma: int,
                       max_decode_len: int, warp: Warp, eos_id: int, draft_inputs: Array,
                       verify: Callable[..., acceptance.VerifyOutput] = acceptance.verify
                       ) -> SpeculativeOutput:
  """Samples from `target` with `draft` proposing `gamma` tokens per target call.

  The output is distributed exactly as `baseline.decode` on the target with
  the same `warp`; at temperature 0 it is the same tokens. The arguments are
  taken as checked (`validation.check_scorer_speculative_args`; the checked
  entry points are `decoding.generate.speculative_sample` for any scorer and
  `models.t5.speculative_sample` for a T5 model): the draft
  shares the scorer's vocabulary, `inputs` and `draft_inputs` hold ids in it,
  one row per example each. The target's `encode` runs here, as its own
  program; the loop is one compiled program per scorer and draft kind, shapes
  and settings.

  Args:
    target: the target's `Scorer`.
    draft: a `drafts.Draft`.
    inputs: int32 `[batch, input_len]`, what `target.encode` takes.
    rng: one PRNG key.
    gamma: proposals per iteration (>= 1).
    max_decode_len: the most tokens to generate per row.
    warp: the sampling settings of both p and q.
    eos_id: the end-of-sequence id.
    draft_inputs: int32 `[batch, draft_input_len]`, the draft's encoder tokens.
    verify: the acceptance rule at temperature > 0, with `acceptance.verify`'s
      signature (the default); tests pass a wrong rule as a negative control.
      At temperature 0 the rule is `acceptance.verify_greedy`.

  Returns:
    A `SpeculativeOutput`.
  """
  return _speculative_sample(target, target.encode(inputs), draft, draft_inputs, rng,
                             gamma=gamma, max_decode_len=max_decode_len, warp=warp,
                             eos_id=eos_id, verify=verify)


@functools.partial(programs.loop_jit, static_argnames=(
    "gamma", "max_decode_len", "warp", "eos_id", "verify"))
def _speculative_sample(target: Scorer, context: object, draft: Draft, draft_inputs: Array,
                        rng: Array, *, gamma: int, max_decode_len: int, warp: Warp, eos_id: int,
                        verify: Callable[..., acceptance.VerifyOutput]) -> SpeculativeOutput:
  """The loop, given the target's context (`target.encode(inputs)`)."""
  cache_len = max_decode_len + gamma + 1
  with jax.named_scope("init"):
    if draft.reads_target_features:
      target_state, target_encoded = target.init_state_with_features(context, cache_len)
    else:
      target_state = target.init_state(context, cache_len)
      target_encoded = target.encoder_outputs(context)
    batch = target.cached_lengths(target_state).shape[0]
    buffer = jnp.full((batch, max_decode_len + gamma + 2), target.pad_id, jnp.int32)
    # An iteration emits at least one token per unfinished row: at most max_decode_len run.
    records = jnp.zeros((batch, max_decode_len), jnp.int32)
    init = SpeculativeLoopState(
        iteration=jnp.array(0, jnp.int32),
        tokens=buffer.at[:, 0].set(target.start_token),
        lengths=jnp.zeros((batch,), jnp.int32),
        done=jnp.zeros((batch,), bool),
        target_state=target_state,
        draft_state=draft.init_state(draft_inputs, cache_len, target_encoded),
        rng=rng,
        records=IterationRecords(
            accepted=records, emitted=records,
            beta_sum=jnp.zeros((batch, 0 if warp.temperature == 0 else max_decode_len),
                               jnp.float32)))

  def cond(state: SpeculativeLoopState) -> Array:
    return ~jnp.all(state.done)

  def body(state: SpeculativeLoopState) -> SpeculativeLoopState:
    return _speculative_step(target, draft, state, gamma=gamma, max_decode_len=max_decode_len,
                             warp=warp, eos_id=eos_id, verify=verify)

  final = jax.lax.while_loop(cond, body, init)
  valid = jnp.arange(max_decode_len)[None] < final.lengths[:, None]
  sequences = jnp.where(valid, final.tokens[:, 1:max_decode_len + 1], 0)
  stats = _reduce_records(final.records, final.iteration, gamma=gamma,
                          forward_passes_per_proposal=draft.forward_passes_per_proposal)
  accepted_mask = valid & _accepted_positions(final.records, max_decode_len)
  return SpeculativeOutput(sequences, final.lengths, stats, accepted_mask)


def _reduce_records(records: IterationRecords, iterations: Array, *, gamma: int,
                    forward_passes_per_proposal: int) -> SpeculativeStats:
  """The `SpeculativeStats` of a generation from its per-iteration records.

  Statistics count only what the output holds: at an iteration that accepted
  n proposals and emitted `count` tokens, verified position j scored the
  emitted token j and counts iff j < count (its context is accepted text
  before any EOS); the accepted proposals in the output are min(n, count).
  """
  n, count = records.accepted, records.emitted  # [batch, max_decode_len]
  ran = count > 0  # An unfinished row emits at least one token.
  emitted_accepted = jnp.minimum(n, count)
  iterations_per_row = jnp.sum(ran, axis=1, dtype=jnp.int32)
  beta_count = jnp.sum(jnp.minimum(count, gamma), axis=1, dtype=jnp.int32)
  if records.beta_sum.shape[1]:
    beta_sum = jnp.sum(records.beta_sum, axis=1)
  else:  # Temperature 0: beta is 1 at the n accepted positions and 0 at the rejected one.
    beta_sum = jnp.sum(emitted_accepted, axis=1).astype(jnp.float32)
  histogram = jnp.sum((emitted_accepted[..., None] == jnp.arange(gamma + 1)) & ran[..., None],
                      axis=1, dtype=jnp.int32)  # [batch, gamma + 1]
  return SpeculativeStats(
      iterations=iterations_per_row,
      draft_forward_passes=iterations_per_row * gamma * forward_passes_per_proposal,
      tokens=jnp.sum(count, axis=1, dtype=jnp.int32),
      accepted_histogram=histogram,
      accepted=jnp.sum(emitted_accepted, axis=1, dtype=jnp.int32),
      rejections=jnp.sum((n < gamma) & (n < count), axis=1, dtype=jnp.int32),
      beta_sum=beta_sum,
      beta_count=beta_count,
      loop_iterations=iterations)


def _accepted_positions(records: IterationRecords, max_decode_len: int) -> Array:
  """bool `[batch, max_decode_len]`: True where the output token is an accepted proposal.

  Iteration i wrote its `count` tokens after the `ends[i - 1]` written before
  it; the first min(n, count) of them are accepted proposals.
  """
  count = records.emitted  # [batch, iterations]
  ends = jnp.cumsum(count, axis=1)  # [batch, iterations]
  t = jnp.arange(max_decode_len)[None, :, None]  # [1, max_decode_len, 1]
  iteration = jnp.sum(ends[:, None, :] <= t, axis=2)  # [batch, max_decode_len]
  iteration = jnp.minimum(iteration, count.shape[1] - 1)
  start = jnp.take_along_axis(ends - count, iteration, axis=1)
  accepted = jnp.take_along_axis(jnp.minimum(records.accepted, count), iteration, axis=1)
  return t[..., 0] - start < accepted


def _write_rows(buffer: Array, chunk: Array, start: Array) -> Array:
  """Writes `chunk [batch, k]` into `buffer [batch, T]` at per-row `start [batch]`."""
  return jax.vmap(lambda b, c, s: jax.lax.dynamic_update_slice(b, c, (s,)))(buffer, chunk, start)


def _speculative_step(target: Scorer, draft: Draft, state: SpeculativeLoopState, *, gamma: int,
                      max_decode_len: int, warp: Warp, eos_id: int,
                      verify: Callable[..., acceptance.VerifyOutput]) -> SpeculativeLoopState:
  """One draft-propose / target-verify / accept / rewind iteration for every row."""
  if warp.temperature == 0:  # Greedy: no random numbers to draw.
    rng = draft_rng = verify_rng = state.rng
  else:
    rng, draft_rng, verify_rng = jax.random.split(state.rng, 3)
  m = state.lengths  # [batch]

  with jax.named_scope("draft"):
    draft_state, proposals, q_logits = draft.propose(
        state.draft_state, state.tokens, m, draft_rng, gamma=gamma, warp=warp)
  with jax.named_scope("verify"):
    last = jnp.take_along_axis(state.tokens, m[:, None], axis=1)  # [batch, 1]
    chunk = jnp.concatenate([last, proposals], axis=1)  # [batch, gamma + 1]
    if draft.reads_target_features:
      p_logits, features, target_state = target.score_with_features(state.target_state, chunk)
    else:
      (p_logits, target_state), features = target.score(state.target_state, chunk), None
  with jax.named_scope("accept"):
    if warp.temperature == 0:
      verdict = acceptance.verify_greedy(proposals, p_logits)
    else:
      verdict = verify(verify_rng, proposals, warp.probs(q_logits), warp.probs(p_logits))
    n = verdict.num_accepted  # [batch]

    # The n accepted proposals, then the next token: n + 1 new tokens per row.
    j = jnp.arange(gamma + 1)[None]  # [1, gamma + 1]
    padded = jnp.pad(proposals, ((0, 0), (0, 1)))
    new = jnp.where(j < n[:, None], padded, verdict.next_token[:, None])  # [batch, gamma + 1]
    # Cut at the first EOS and at max_decode_len.
    is_eos = (new == eos_id) & (j <= n[:, None])
    first_eos = jnp.where(jnp.any(is_eos, 1), jnp.argmax(is_eos, 1), gamma + 1)  # [batch]
    count = jnp.minimum(jnp.minimum(n + 1, first_eos + 1), max_decode_len - m)
    count = jnp.where(state.done, 0, count)  # [batch]
    new_lengths = m + count
    done = state.done | (first_eos < count) | (new_lengths >= max_decode_len)

  with jax.named_scope("write"):
    # Everything past a row's new length is scratch (finished rows included): the
    # next write starts there, and the output masks it.
    tokens = _write_rows(state.tokens, new, m + 1)
    records = state.records
    at = (0, state.iteration)
    records = records.replace(
        accepted=jax.lax.dynamic_update_slice(records.accepted, n[:, None], at),
        emitted=jax.lax.dynamic_update_slice(records.emitted, count[:, None], at))
    if records.beta_sum.shape[1]:
      # Position j scored new[j] and counts iff new[j] is emitted (j < count).
      beta = jnp.sum(jnp.where(j[:, :gamma] < count[:, None], verdict.beta, 0.0), axis=1)
      records = records.replace(
          beta_sum=jax.lax.dynamic_update_slice(records.beta_sum, beta[:, None], at))

  with jax.named_scope("rewind"):
    target_state = target.rewind(target_state, new_lengths)
    draft_state = draft.commit(draft_state, new_lengths, tokens, features)
  return SpeculativeLoopState(
      iteration=state.iteration + 1,
      tokens=tokens,
      lengths=new_lengths,
      done=done,
      target_state=target_state,
      draft_state=draft_state,
      rng=rng,
      records=records)
