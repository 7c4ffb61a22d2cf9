"""A draft that reads its target's features as well as the tokens (EAGLE, Li et al. 2024).

A decoder-only target's final-normed hidden state at position t (its feature f_t) is
what its head turns into the distribution of token t + 1. This draft's input at
position t is token t's projected embedding plus its projected f_{t-1}; one or a few
Llama blocks of its own width follow, then a shortlist head for q, and a projection
that predicts f_t. Verification is unchanged, so the output stays exactly the
target's; only q improves.

Where the features come from, in the speculative loop's iteration at length m
(`decoding.speculative`: `tokens[:, m]` the last token, the target's cache m long):

  init_state  the target's prefill gives f at the prompt's positions; the draft runs
              its prompt (the last prompt token, the loops' position 0, reads the
              prefill's last feature) and keeps q and its predicted feature at 0.
  propose     proposal 1 is drawn from the kept q (computed from the target's true
              features); proposals 2 .. gamma from the draft's own steps, each
              reading the feature the draft predicted at the step before.
  commit      the target scored positions m .. m + gamma and gave their features;
              n were accepted, so the new length is m' = m + n + 1. The draft
              rewinds to position m (true inputs only) and runs positions m + 1 ...
              m + gamma + 1 in one chunk, each with the target's feature of the
              position before; it keeps q and the predicted feature at m' (chunk
              index n) and rewinds to m'. So every cached position of the draft read
              the target's true feature. `advance` is this step from a state with
              nothing pending (the tree loop's commit: `feature_branches`).

`Student.feature_draft` builds one from a trained `Student` with `feature_size` > 0.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models.kernels import DecoderCache
from specdec_jax.models.llama.model import LlamaModel, LlamaWeights, decode_hidden, logits_of
from specdec_jax.models.llama.scorer import prompt_lengths

Array = jax.Array


@struct.dataclass
class FeatureDraftState:
  """State of a `FeatureDraft` in one generation, at the loops' length m.

  Attributes:
    cache: the draft's keys and values at model positions (prompt included);
      `cache.lengths` = n + m while no proposal is pending: every position up to
      the loops' m, each computed from true tokens and the target's true features.
    prompt_lengths: int32 `[batch]`, n per row (the loops' position 0 is model
      position n - 1).
    logits: float32 `[batch, vocab]`, q of the token after position m.
    feature: float32 `[batch, F]`, the draft's prediction of the target's feature at m.
  """

  cache: DecoderCache
  prompt_lengths: Array
  logits: Array
  feature: Array


@struct.dataclass
class FeatureDraft(Draft):
  """A trained feature-reading draft (`Student` with `feature_size` F > 0), prepared.

  It reads the same prompts as the target (`draft_inputs` = the target's inputs).

  Attributes:
    model: the `LlamaModel` of the draft's blocks (static).
    weights: its prepared weights (`Student.prepare`: projected embedding, shortlist head).
    feature_in: `[F, d_model]`, the projection of the target's features into its input.
    feature_out: `[d_model, F]`, the projection of its final-normed hidden state to the
      target's next feature.
  """

  model: LlamaModel = struct.field(pytree_node=False)
  weights: LlamaWeights
  feature_in: Array
  feature_out: Array

  @property
  def vocab_size(self) -> int:
    return self.model.config.vocab_size

  @property
  def feature_size(self) -> int:
    return self.feature_in.shape[0]

  @property
  def forward_passes_per_proposal(self) -> int:
    return 1

  @property
  def reads_target_features(self) -> bool:
    return True

  @property
  def compiler_options(self) -> tuple[tuple[str, Any], ...]:
    return self.model.options.compiler_options

  def run(self, cache: DecoderCache, tokens: Array, features: Array,
          tree: tuple[Array, Array] | None = None) -> tuple[Array, Array, DecoderCache]:
    """`tokens [batch, k]` reading `features [batch, k, F]` (each its previous
    position's) -> float32 logits `[batch, k, vocab]`, float32 predicted features
    `[batch, k, F]` and the advanced cache. The chunk is a chain, or the token
    tree `tree` = (depths, ancestors) (`decoding.trees.layout`; `decode_hidden`)."""
    hidden, cache = self._hidden(cache, tokens, features, tree)
    return *self._heads(hidden), cache

  def _hidden(self, cache: DecoderCache, tokens: Array, features: Array,
              tree: tuple[Array, Array] | None = None) -> tuple[Array, DecoderCache]:
    """`run` up to the final-normed hidden states `[batch, k, d_model]`."""
    config = self.model.config
    extra = (jnp.asarray(features, config.compute_dtype)
             @ jnp.asarray(self.feature_in, config.compute_dtype))
    return decode_hidden(config, self.model.options, self.weights, cache, tokens, extra, tree)

  def _heads(self, hidden: Array) -> tuple[Array, Array]:
    """`run`'s float32 logits and predicted features of `hidden`."""
    config = self.model.config
    logits = logits_of(config, self.model.options, self.weights, hidden)
    predicted = hidden @ jnp.asarray(self.feature_out, config.compute_dtype)
    return logits.astype(jnp.float32), predicted.astype(jnp.float32)

  def init_state(self, inputs: Array, cache_len: int,
                 target_encoded: Array | None = None) -> FeatureDraftState:
    """Runs the prompts `inputs [batch, width]` (0-padded) reading the target's prefill
    features `target_encoded [batch, width - 1, F]` (None: zeros)."""
    batch, width = inputs.shape
    if target_encoded is None:
      target_encoded = jnp.zeros((batch, width - 1, self.feature_size), jnp.float32)
    # Prompt column i reads the feature of position i - 1 (none before position 0).
    features = jnp.concatenate([jnp.zeros((batch, 1, self.feature_size), jnp.float32),
                                jnp.asarray(target_encoded, jnp.float32)[:, :width - 1]],
                               axis=1)                                    # [batch, width, F]
    n = prompt_lengths(inputs)
    cache = self.model.init_cache(batch, width + cache_len)
    hidden, cache = self._hidden(cache, inputs, features)
    last = (n - 1)[:, None, None]                     # The loops' position 0.
    # The heads there alone: q of the prompt's other positions is never read (at batch 512
    # with a 45-token prompt they were 4.5 GB of logits).
    logits, predicted = self._heads(jnp.take_along_axis(hidden, last, axis=1))
    return FeatureDraftState(cache=cache.rewind(n), prompt_lengths=n, logits=logits[:, 0],
                             feature=predicted[:, 0])

  def propose(self, state: FeatureDraftState, tokens: Array, lengths: Array, rng: Array, *,
              gamma: int, warp: Warp) -> tuple[FeatureDraftState, Array, Array]:
    del tokens, lengths  # The state is at the loops' length (commit keeps it there).
    rngs = jax.random.split(rng, gamma)
    first = warp.sample(rngs[0], state.logits)  # [batch]

    def step(carry, step_rng):
      cache, token, feature = carry
      logits, predicted, cache = self.run(cache, token[:, None], feature[:, None])
      new_token = warp.sample(step_rng, logits[:, 0])
      return (cache, new_token, predicted[:, 0]), (new_token, logits[:, 0])

    (cache, _, _), (rest, rest_logits) = jax.lax.scan(
        step, (state.cache, first, state.feature), rngs[1:], unroll=True)
    proposals = jnp.concatenate([first[:, None], rest.T], axis=1)  # [batch, gamma]
    q_logits = jnp.concatenate([state.logits[:, None], jnp.swapaxes(rest_logits, 0, 1)],
                               axis=1)  # [batch, gamma, V]
    return state.replace(cache=cache), proposals, q_logits

  def commit(self, state: FeatureDraftState, lengths: Array, tokens: Array | None = None,
             features: Array | None = None) -> FeatureDraftState:
    if tokens is None or features is None:
      raise ValueError("FeatureDraft.commit needs the text (tokens) and the target's features "
                       "of the verified chunk; the speculative loop passes both.")
    gamma = features.shape[1] - 1
    # Propose ran gamma - 1 steps past position m: back to m, nothing pending.
    return self.advance(state.replace(cache=state.cache.rewind(state.cache.lengths - gamma + 1)),
                        lengths, tokens, features)

  def advance(self, state: FeatureDraftState, lengths: Array, tokens: Array, features: Array
              ) -> FeatureDraftState:
    """The state at the loops' length m (nothing pending) taken to `lengths`.

    Args:
      state: the state at m (`cache.lengths` = n + m).
      lengths: int32 `[batch]`, m' = m + 1 .. m + g + 1 (m where a row is finished).
      tokens: int32 `[batch, buffer_len]`, the text with tokens m + 1 .. m' written.
      features: float32 `[batch, g + 1, F]`, the target's features at m .. m + g
        along the accepted text (valid up to m' - 1).

    Returns:
      The state at m': positions m + 1 .. m' run in one chunk, each reading the
      target's feature of the position before; q and the predicted feature at m'.
    """
    width = features.shape[1]
    n = state.prompt_lengths
    m = state.cache.lengths - n
    chunk = jax.vmap(lambda row, s: jax.lax.dynamic_slice(row, (s,), (width,)))(
        tokens, m + 1)                                          # positions m + 1 .. m + g + 1
    logits, predicted, cache = self.run(state.cache, chunk, features)
    at = jnp.clip(lengths - m - 1, 0, width - 1)[:, None, None]  # Position m' (finished: any).
    return FeatureDraftState(
        cache=cache.rewind(n + lengths), prompt_lengths=n,
        logits=jnp.take_along_axis(logits, at, axis=1)[:, 0],
        feature=jnp.take_along_axis(predicted, at, axis=1)[:, 0])
