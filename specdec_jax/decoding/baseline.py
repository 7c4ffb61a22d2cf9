"""The T5X-style baseline: autoregressive temperature sampling in one `lax.while_loop`.

Every speedup in this project is measured against this loop, so it is
built to be strong: the encoder runs once, cross-attention keys/values are
projected once, the self-attention cache lives in the loop state, the whole
generation is one compiled program (no host round-trip per token), and compiled
programs are reused across calls of the same shapes and settings.

The loop is written against a `scorer.Scorer`, like the speculative one: each
step scores a chunk of k = 1 token (the speculative loop scores k = gamma + 1
per target call) and samples from its logits with `sampling.Warp`. It imports
no model: `models.t5.temperature_sample` is `decode` with a `T5Scorer`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.decoding import programs
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import Scorer

Array = jax.Array


@struct.dataclass
class DecodeOutput:
  """Generated tokens.

  Attributes:
    sequences: int32 `[batch, max_decode_len]`, the generated tokens (the
      decoder start token excluded), EOS included, padding (0) after it.
    lengths: int32 `[batch]`, the number of generated tokens, EOS included.
  """

  sequences: Array
  lengths: Array


@struct.dataclass
class SamplingLoopState:
  """State of the baseline's while loop.

  Attributes:
    step: int32 `[]`, the number of decoding steps taken.
    sequences: int32 `[batch, max_decode_len]`, tokens so far (0 beyond `step`).
    last_token: int32 `[batch]`, the token fed to the next step.
    done: bool `[batch]`, True once a row has emitted EOS.
    scorer_state: the scorer's state; `cached_lengths == step` on every row.
    rng: the PRNG key for the remaining steps.
  """

  step: Array
  sequences: Array
  last_token: Array
  done: Array
  scorer_state: object
  rng: Array


def decode(scorer: Scorer, inputs: Array, rng: Array, *, max_decode_len: int, warp: Warp,
           eos_id: int) -> DecodeOutput:
  """Samples (or, at temperature 0, greedily decodes) from any `Scorer`.

  The arguments are taken as checked (`validation.check_scorer_decode_args`;
  `decoding.generate.sample` checks them for any scorer, `models.t5.temperature_sample`
  for a T5 model): `inputs` in the
  scorer's vocabulary, `max_decode_len` >= 1, `eos_id`
  an int. The scorer's `encode` runs here, as its own program; the loop is one
  compiled program per scorer kind, shapes and settings.

  Args:
    scorer: the model side (`scorer.Scorer`).
    inputs: int32 `[batch, input_len]`, what `scorer.encode` takes.
    rng: one PRNG key; unused when greedy.
    max_decode_len: the most tokens to generate per row.
    warp: the sampling settings.
    eos_id: the end-of-sequence id.

  Returns:
    `DecodeOutput` with `[batch, max_decode_len]` sequences and `[batch]` lengths.
  """
  return decode_context(scorer, scorer.encode(inputs), rng, max_decode_len=max_decode_len,
                             warp=warp, eos_id=eos_id)


@functools.partial(programs.loop_jit, static_argnames=("max_decode_len", "warp",
                                                             "eos_id"))
def decode_context(scorer: Scorer, context: object, rng: Array, *, max_decode_len: int,
                   warp: Warp, eos_id: int) -> DecodeOutput:
  """`decode` given the scorer's context (`scorer.encode(inputs, ...)`, computed by the
  caller: e.g. a shared-encoder draft's, from stored encoder outputs); the loop itself,
  one compiled program, inlined under an outer trace."""
  state = scorer.init_state(context, max_decode_len)
  batch = scorer.cached_lengths(state).shape[0]
  init = SamplingLoopState(
      step=jnp.array(0, jnp.int32),
      sequences=jnp.full((batch, max_decode_len), scorer.pad_id, jnp.int32),
      last_token=jnp.full((batch,), scorer.start_token, jnp.int32),
      done=jnp.zeros((batch,), bool),
      scorer_state=state,
      rng=rng)

  def cond(state: SamplingLoopState) -> Array:
    return (state.step < max_decode_len) & ~jnp.all(state.done)

  def body(state: SamplingLoopState) -> SamplingLoopState:
    return _sampling_step(scorer, state, warp=warp, eos_id=eos_id)

  final = jax.lax.while_loop(cond, body, init)
  lengths = jnp.where(final.done, _first_index(final.sequences, eos_id) + 1, final.step)
  return DecodeOutput(final.sequences, lengths)


def _sampling_step(scorer: Scorer, state: SamplingLoopState, *, warp: Warp,
                   eos_id: int) -> SamplingLoopState:
  """One step for every row: score a chunk of one token, sample; finished rows emit padding."""
  with jax.named_scope("score"):
    logits, scorer_state = scorer.score(state.scorer_state, state.last_token[:, None])
  with jax.named_scope("sample"):
    rng, step_rng = jax.random.split(state.rng)
    token = warp.sample(step_rng, logits[:, 0])
    token = jnp.where(state.done, scorer.pad_id, token)
  with jax.named_scope("write"):
    sequences = jax.lax.dynamic_update_slice(state.sequences, token[:, None], (0, state.step))
  return SamplingLoopState(step=state.step + 1, sequences=sequences, last_token=token,
                           done=state.done | (token == eos_id), scorer_state=scorer_state,
                           rng=rng)


def _first_index(sequences: Array, token: int) -> Array:
  """int32 `[batch]` index of the first `token` in each row (row length if none)."""
  hits = sequences == token
  return jnp.where(jnp.any(hits, axis=1), jnp.argmax(hits, axis=1),
                   sequences.shape[1]).astype(jnp.int32)
