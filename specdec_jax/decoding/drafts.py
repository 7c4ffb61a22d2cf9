"""Draft models for speculative sampling, behind one small interface.

A draft proposes `gamma` tokens per row and returns the logits of the
distribution each was drawn from (`q`, before warping: the sampler warps draft
and target logits with the same `sampling.Warp`, so proposals must be drawn
with `warp.sample` under it too). Kinds here, none of them tied to a model
family:

  * `ScorerDraft`: any `scorer.Scorer` plus one proposal rule; each model
    family's drafts build on it (`models.t5.T5Draft`,
    `models.t5.SharedEncoderDraft`, `models.llama.LayerSkipDraft`).
  * `NgramDraft`: the paper's trivial unigram / bigram drafts (Table 3),
    estimated from token counts of a corpus.
  * `PromptLookupDraft`: proposes the continuation of the longest n-gram of
    the generated text found in the input (a deterministic draft: q is a
    point mass; useful for summarization; beyond the paper).

Drafts are pytrees (`flax.struct.dataclass`): arrays such as parameters are
traced leaves, configuration is static, so one compiled loop serves any
weights of the same shapes.

Conventions shared with `speculative.py`: `tokens [batch, buffer_len]` holds the
decoder start token at index 0 and the generated tokens after it; `lengths
[batch]` = m is the number generated, so `tokens[:, m]` is the last token,
which neither model has processed yet.
"""

from __future__ import annotations

import abc
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax import validation
from specdec_jax.decoding import lookup
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import EncoderOutputs, Scorer

Array = jax.Array


def _last_tokens(tokens: Array, lengths: Array) -> Array:
  """`tokens[b, lengths[b]]`: `[batch, T]`, `[batch]` -> `[batch]`."""
  return jnp.take_along_axis(tokens, lengths[:, None], axis=1)[:, 0]


class Draft(abc.ABC):
  """What the speculative loop needs from a draft."""

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Size of the draft's vocabulary (must equal the target's)."""

  @property
  def forward_passes_per_proposal(self) -> int:
    """Model forward passes per proposed token (0 for table look-ups)."""
    return 0

  @property
  def reads_target_encoder(self) -> bool:
    """Whether `init_state` needs the target's encoder outputs (`target_encoded`)."""
    return False

  @property
  def reads_target_features(self) -> bool:
    """Whether it reads the target's features (EAGLE-style: `models.llama.FeatureDraft`):
    then `init_state` takes the prompts' and `commit` each verified chunk's
    (`Scorer.init_state_with_features`, `Scorer.score_with_features`)."""
    return False

  @property
  def compiler_options(self) -> tuple[tuple[str, Any], ...]:
    """XLA options of a loop that times this draft alone (`programs.loop_jit`): a model
    draft's are its model's; none for a table look-up."""
    return ()

  @abc.abstractmethod
  def init_state(self, inputs: Array, cache_len: int,
                 target_encoded: EncoderOutputs = None) -> Any:
    """Per-generation state (e.g. encoder outputs and a cache).

    Args:
      inputs: int32 `[batch, input_len]`: encoder tokens, or a decoder-only
        target's prompts.
      cache_len: positions the decoder may reach (max_decode_len + gamma + 1).
      target_encoded: what the target's scorer gives drafts of the same
        examples (`Scorer.encoder_outputs`, e.g. a T5 target's encoder
        outputs); required iff `reads_target_encoder`. A draft that
        `reads_target_features` takes the target's features of the prompts
        here (`Scorer.init_state_with_features`; None: zeros, to time it alone).
    """

  @abc.abstractmethod
  def propose(self, state: Any, tokens: Array, lengths: Array, rng: Array, *, gamma: int,
              warp: Warp) -> tuple[Any, Array, Array]:
    """Proposes `gamma` tokens after `tokens[:, :lengths + 1]` per row.

    Args:
      state: the draft's state (`init_state`, then `commit`).
      tokens: int32 `[batch, buffer_len]`, the start token and the text so far.
      lengths: int32 `[batch]`, m = tokens generated; `tokens[:, m]` is the last.
      rng: the PRNG key of this iteration's proposals.
      gamma: proposals per row (static).
      warp: the sampling settings (static) every proposal is drawn with.

    Returns:
      The new state, proposals int32 `[batch, gamma]` and the draft logits
      `[batch, gamma, vocab]` that proposal j was sampled from (warped by `warp`).
    """

  def commit(self, state: Any, lengths: Array, tokens: Array | None = None,
             features: Array | None = None) -> Any:
    """Rewinds the state to `lengths [batch]` generated tokens (accepted text).

    A draft that `reads_target_features` also takes the text, int32 `tokens
    [batch, buffer_len]` (as `propose`'s, with this iteration's tokens written), and
    the features `[batch, gamma + 1, F]` the target computed for the chunk it just
    verified (positions m ... m + gamma, m the lengths `propose` was given; zeros to
    time the draft alone); other drafts ignore both.
    """
    del lengths, tokens, features
    return state


class ScorerDraft(Draft):
  """A model as the draft: a `Scorer` plus the proposal rule "sample one token at a time".

  Each `propose` scores the text the draft has not seen yet, then samples
  gamma tokens one by one from its own logits, each fed back as the next
  chunk; `commit` rewinds the scorer to the accepted text. Subclasses give the
  `scorer`; the state is the scorer's.
  """

  @property
  @abc.abstractmethod
  def scorer(self) -> Scorer:
    """The draft model's scorer."""

  @property
  def vocab_size(self) -> int:
    return self.scorer.vocab_size

  @property
  def forward_passes_per_proposal(self) -> int:
    return 1

  @property
  def reads_target_encoder(self) -> bool:
    return self.scorer.reads_target_encoder

  @property
  def compiler_options(self) -> tuple[tuple[str, Any], ...]:
    return self.scorer.compiler_options

  def init_state(self, inputs: Array, cache_len: int,
                 target_encoded: EncoderOutputs = None) -> Any:
    scorer = self.scorer
    return scorer.init_state(scorer.encode(inputs, target_encoded), cache_len)

  def propose(self, state: Any, tokens: Array, lengths: Array, rng: Array, *, gamma: int,
              warp: Warp) -> tuple[Any, Array, Array]:
    scorer = self.scorer
    last = _last_tokens(tokens, lengths)  # [batch]
    # Rows whose cache ends one token short first feed the token before `last`;
    # the others feed `last` and a throw-away token that the rewind below drops.
    catch_up = scorer.cached_lengths(state) < lengths  # [batch]
    prev = _last_tokens(tokens, jnp.maximum(lengths - 1, 0))  # [batch]
    pad = jnp.zeros_like(last)
    chunk = jnp.where(catch_up[:, None], jnp.stack([prev, last], 1),
                      jnp.stack([last, pad], 1))  # [batch, 2]
    logits, state = scorer.score(state, chunk)
    first_logits = jnp.where(catch_up[:, None], logits[:, 1], logits[:, 0])  # [batch, V]
    state = scorer.rewind(state, lengths + 1)
    rngs = jax.random.split(rng, gamma)
    first = warp.sample(rngs[0], first_logits)  # [batch]

    def step(carry, step_rng):
      state, token = carry
      logits, state = scorer.score(state, token[:, None])
      new_token = warp.sample(step_rng, logits[:, 0])
      return (state, new_token), (new_token, logits[:, 0])

    # Unrolled: gamma - 1 small steps, no loop to run; and GSPMD then keeps the
    # cache sharded as the caller's (a scan carry lost the heads' sharding).
    (state, _), (rest, rest_logits) = jax.lax.scan(step, (state, first), rngs[1:], unroll=True)
    proposals = jnp.concatenate([first[:, None], rest.T], axis=1)  # [batch, gamma]
    q_logits = jnp.concatenate([first_logits[:, None], jnp.swapaxes(rest_logits, 0, 1)],
                               axis=1)  # [batch, gamma, V]
    return state, proposals, q_logits

  def commit(self, state: Any, lengths: Array, tokens: Array | None = None,
             features: Array | None = None) -> Any:
    # After `propose` the cache holds m + gamma positions; the accepted text
    # needs lengths = m + n + 1 of them, of which only m + gamma exist if n == gamma.
    del tokens, features
    scorer = self.scorer
    return scorer.rewind(state, jnp.minimum(lengths, scorer.cached_lengths(state)))


@struct.dataclass
class NgramDraft(Draft):
  """The paper's unigram (order 1) or bigram (order 2) draft.

  q(x | prev) = w[prev] * bigram(x | prev) + (1 - w[prev]) * unigram(x), with the
  bigram part restricted to the `top_next` most frequent successors of `prev`
  and the Witten-Bell weight w = n(prev) / (n(prev) + types(prev)). Unigram
  probabilities are add-one smoothed, so q > 0 everywhere.

  Attributes:
    order: 1 or 2 (static).
    unigram: float32 `[vocab]` unigram probabilities.
    next_ids: int32 `[vocab, top_next]` successors of each token.
    next_probs: float32 `[vocab, top_next]` their conditional probabilities.
    weight: float32 `[vocab]` the bigram weight w of each context token.

  Raises:
    ValueError: from the constructor, if `order` is not 1 or 2; from
      `from_counts`, for malformed counts (`validation.check_ngram_counts`).
  """

  order: int = struct.field(pytree_node=False)
  unigram: Array
  next_ids: Array
  next_probs: Array
  weight: Array

  def __post_init__(self):
    object.__setattr__(self, "order", validation.check_ngram_order(self.order))

  @property
  def vocab_size(self) -> int:
    return int(self.unigram.shape[0])

  @classmethod
  def from_counts(cls, unigram_counts: np.ndarray, bigram_prev: np.ndarray,
                  bigram_next: np.ndarray, bigram_count: np.ndarray, *, order: int,
                  top_next: int = 32) -> NgramDraft:
    """Builds the draft from token counts (see `data.ngram_stats.NgramStats`).

    Args:
      unigram_counts: `[vocab]` counts of each token.
      bigram_prev: `[N]` context token of each observed bigram.
      bigram_next: `[N]` following token.
      bigram_count: `[N]` count of each (prev, next) pair.
      order: 1 (unigram) or 2 (bigram).
      top_next: successors kept per context token.
    """
    order = validation.check_ngram_order(order)
    top_next = validation.as_int("top_next", top_next, minimum=1,
                                 what="successors kept per context token")
    unigram_counts, bigram_prev, bigram_next, bigram_count = validation.check_ngram_counts(
        unigram_counts, bigram_prev, bigram_next, bigram_count)
    vocab = int(unigram_counts.shape[0])
    unigram = (unigram_counts + 1.0) / (unigram_counts.sum() + vocab)
    next_ids = np.zeros((vocab, top_next), np.int32)
    next_probs = np.zeros((vocab, top_next), np.float32)
    weight = np.zeros((vocab,), np.float32)
    # Sort by (prev, -count, next) so each context's successors come most frequent first.
    order_idx = np.lexsort((bigram_next, -bigram_count, bigram_prev))
    prev, nxt, cnt = bigram_prev[order_idx], bigram_next[order_idx], bigram_count[order_idx]
    starts = np.searchsorted(prev, np.arange(vocab + 1))
    for token in np.nonzero(np.diff(starts))[0]:
      lo, hi = starts[token], starts[token + 1]
      keep = slice(lo, min(hi, lo + top_next))
      total = cnt[lo:hi].sum()
      n_keep = keep.stop - keep.start
      next_ids[token, :n_keep] = nxt[keep]
      next_probs[token, :n_keep] = cnt[keep] / cnt[keep].sum()
      weight[token] = total / (total + (hi - lo))
    return cls(order, jnp.asarray(unigram, jnp.float32), jnp.asarray(next_ids),
               jnp.asarray(next_probs), jnp.asarray(weight))

  def init_state(self, inputs: Array, cache_len: int,
                 target_encoded: EncoderOutputs = None) -> None:
    del inputs, cache_len, target_encoded
    return None

  def _logits(self, prev: Array) -> Array:
    """log q(. | prev): `[batch]` -> `[batch, vocab]`."""
    unigram = jnp.broadcast_to(self.unigram, prev.shape + self.unigram.shape)
    if self.order == 1:
      return jnp.log(unigram)
    w = self.weight[prev][:, None]  # [batch, 1]
    rows = jnp.arange(prev.shape[0])[:, None]
    q = ((1.0 - w) * unigram).at[rows, self.next_ids[prev]].add(w * self.next_probs[prev])
    return jnp.log(q)

  def propose(self, state: None, tokens: Array, lengths: Array, rng: Array, *, gamma: int,
              warp: Warp) -> tuple[None, Array, Array]:
    def step(prev, step_rng):
      logits = self._logits(prev)
      token = warp.sample(step_rng, logits)
      return token, (token, logits)

    _, (proposals, logits) = jax.lax.scan(step, _last_tokens(tokens, lengths),
                                          jax.random.split(rng, gamma))
    return state, proposals.T, jnp.swapaxes(logits, 0, 1)


@struct.dataclass
class PromptLookupDraft(Draft):
  """Copies from the input: the continuation of the longest matching n-gram.

  The last `n` generated tokens (n = max_ngram down to 1; the first n with a
  match wins, and the earliest match within it: `lookup.match_start`) are
  looked up in the encoder input, and the `gamma` input tokens after the
  match are proposed. With no
  match, the last token is proposed `gamma` times. q is a point mass on each
  proposal (logits 0 there, -inf elsewhere), so acceptance is min(1, p(x)).

  Raises:
    ValueError: from the constructor, unless `vocab` and `max_ngram` are ints >= 1.
  """

  vocab: int = struct.field(pytree_node=False)
  max_ngram: int = struct.field(pytree_node=False, default=3)

  def __post_init__(self):
    object.__setattr__(self, "vocab", validation.as_int(
        "vocab", self.vocab, minimum=1, what="the target's vocabulary size"))
    object.__setattr__(self, "max_ngram", validation.as_int(
        "max_ngram", self.max_ngram, minimum=1, what="the longest n-gram looked up"))

  @property
  def vocab_size(self) -> int:
    return self.vocab

  def init_state(self, inputs: Array, cache_len: int,
                 target_encoded: EncoderOutputs = None) -> Array:
    del cache_len, target_encoded
    return inputs

  def propose(self, state: Array, tokens: Array, lengths: Array, rng: Array, *, gamma: int,
              warp: Warp) -> tuple[Array, Array, Array]:
    del rng, warp  # Deterministic.
    inputs = state  # [batch, L]
    input_len = inputs.shape[1]
    last = _last_tokens(tokens, lengths)
    found, start = lookup.match_start(inputs, tokens, lengths, self.max_ngram)
    positions = jnp.minimum(start[:, None] + jnp.arange(gamma)[None], input_len - 1)
    copied = jnp.take_along_axis(inputs, positions, axis=1)  # [batch, gamma]
    proposals = jnp.where(found[:, None], copied, last[:, None]).astype(jnp.int32)
    q_logits = jnp.where(jax.nn.one_hot(proposals, self.vocab, dtype=bool), 0.0, -jnp.inf)
    return state, proposals, q_logits
