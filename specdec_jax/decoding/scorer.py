"""Scorers: the model side of both decoding loops, behind one small interface.

A scorer turns a chunk of k >= 1 tokens per row into the logits after each of
them, against a per-row cache (T5X's `tokens_to_logits`, a maxtext engine's
prefill / generate). The baseline scores a chunk of k = 1 token per step; the
speculative loop scores k = gamma + 1 tokens per target call with the same
method; a model draft proposes with its own scorer (`drafts.ScorerDraft`).
The loops never touch a model: a hand-written scorer (a logits table, in the
tests) or a decoder-only model fits the same loops.

One generation, as the loops drive it:

  context = scorer.encode(inputs, target_encoded)   # once per input (the encoder pass)
  state = scorer.init_state(context, cache_len)     # an empty cache of cache_len positions
  logits, state = scorer.score(state, tokens)       # [batch, k] at positions
                                                    # cached_lengths(state) ... + k - 1
  state = scorer.rewind(state, lengths)             # per-row cached lengths set back

Positions count the decoder tokens fed: position 0 holds `start_token`, and
position m the m-th generated token. Rewinding only sets each row's length:
entries at or beyond it are masked and overwritten by the next chunk (no copy).

The loops run `encode` for the target before their compiled loop (the target's
encoder is its own program, with XLA's default options; the loop's are the
scorer's `compiler_options`: `programs.loop_jit`) and `init_state` inside it (the cache is
created where it lives). A draft's scorer runs both inside the loop.

A decoder-only model has no encoder: its prompt is the context. `encode`
keeps the prompts, `init_state` prefills all but each row's last prompt
token, and that last token stands at position 0 in place of `start_token`,
so positions count from the prompt's end (`models.llama.LlamaScorer`). Each model
family's scorers live in its package (`models.t5.T5Scorer`, `models.llama.LlamaScorer`).

The interface is model-agnostic: a `Context` (what `encode` computes once per
input), a state and the `EncoderOutputs` a draft may read (`encoder_outputs`,
passed on as `target_encoded`) are whatever pytrees the scorer defines (a T5's
encoder outputs, a decoder-only model's prompts); the loops pass them on
without looking inside.

Scorers are pytrees (`flax.struct.dataclass`): the model is static, its
parameters are traced leaves, so one compiled loop serves any weights of the
same shapes.
"""

from __future__ import annotations

import abc
from typing import Any

import jax

Array = jax.Array
# What a scorer computes once per input (`Scorer.encode`) and starts each generation
# from (`Scorer.init_state`): a pytree of the scorer's own kind.
Context = Any
# What a scorer lets a draft read of its context (`Scorer.encoder_outputs`, given to
# `Draft.init_state` as `target_encoded`): a pytree of the scorer's own kind, or None.
EncoderOutputs = Any


class Scorer(abc.ABC):
  """What the decoding loops need from a model: score chunks against a rewindable cache."""

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Size of the vocabulary the logits range over."""

  @property
  @abc.abstractmethod
  def start_token(self) -> int:
    """The token at position 0, fed before the first generated one."""

  @property
  @abc.abstractmethod
  def pad_id(self) -> int:
    """The padding id the outputs carry after a row's end."""

  @property
  def encoder_width(self) -> int | None:
    """The width of the encoder outputs a draft may read (`encoder_outputs`); None: no
    encoder."""
    return None

  @property
  def reads_target_encoder(self) -> bool:
    """Whether `encode` needs the target's encoder outputs (`target_encoded`)."""
    return False

  @property
  def decode_options(self) -> Any:
    """The `models.options.DecodeOptions` of the model behind it, or None (no model)."""
    return None

  @property
  def compiler_options(self) -> tuple[tuple[str, Any], ...]:
    """XLA options, sorted `(name, value)` pairs, of the loops' programs over this scorer
    (`programs.loop_jit`): its model's `DecodeOptions.compiler_options`; none without."""
    options = self.decode_options
    return () if options is None else options.compiler_options

  @abc.abstractmethod
  def encode(self, inputs: Array, target_encoded: EncoderOutputs = None) -> Context:
    """The work done once per input, e.g. the encoder pass.

    Args:
      inputs: int32 `[batch, input_len]`, 0-padded: an encoder's tokens, or
        a decoder-only model's prompts.
      target_encoded: the target's encoder outputs of the same examples
        (`encoder_outputs` of the target's context); required iff
        `reads_target_encoder`.

    Returns:
      The context `init_state` starts from (a pytree).
    """

  @abc.abstractmethod
  def init_state(self, context: Context, cache_len: int) -> Any:
    """The state of a generation: `context` and an empty cache of `cache_len` positions."""

  @abc.abstractmethod
  def score(self, state: Any, tokens: Array) -> tuple[Array, Any]:
    """Scores `tokens` at each row's next positions.

    Args:
      state: the generation's state; the caller keeps
        `cached_lengths(state) + k <= cache_len`.
      tokens: int32 `[batch, k]`; row b at positions `cached_lengths(state)[b]`
        ... `+ k - 1`.

    Returns:
      float32 logits `[batch, k, vocab]` (logits[:, i] predict the token after
      tokens[:, i]) and the state with every row's cached length advanced by k.
    """

  @abc.abstractmethod
  def cached_lengths(self, state: Any) -> Array:
    """int32 `[batch]`: the positions each row has scored (where its next chunk goes)."""

  @abc.abstractmethod
  def rewind(self, state: Any, lengths: Array) -> Any:
    """Sets each row's cached length to `lengths [batch]` (at most its current one)."""

  def encoder_outputs(self, context: Context) -> EncoderOutputs:
    """The encoder outputs a draft may read (`Draft.reads_target_encoder`), or None."""
    del context
    return None

  # Features: an addition a draft that reads the target's hidden states (`drafts.FeatureDraft`)
  # needs, and that scorers without them (a T5's, a table) leave as is.

  @property
  def feature_size(self) -> int:
    """The width F of the features `score_with_features` gives (0: none)."""
    return 0

  def init_state_with_features(self, context: Context, cache_len: int) -> tuple[Any, Array]:
    """`init_state`, and float32 features `[batch, context_len, F]` of the context's
    positions (a decoder-only model's prefill)."""
    raise NotImplementedError(f"{type(self).__name__} gives no features (feature_size 0): "
                              "a draft that reads the target's features needs a target "
                              "that gives them, e.g. models.llama.LlamaScorer.")

  def score_with_features(self, state: Any, tokens: Array) -> tuple[Array, Array, Any]:
    """`score`, and float32 features `[batch, k, F]`: the model's final hidden state at
    each position, the one its logits are computed from."""
    raise NotImplementedError(f"{type(self).__name__} gives no features (feature_size 0): "
                              "a draft that reads the target's features needs a target "
                              "that gives them, e.g. models.llama.LlamaScorer.")

  # Trees: scoring n candidate tokens given each one's parent (`decoding.trees`), for the
  # tree loop (`tree_speculative`). A chain is the tree whose parents are i - 1.

  def score_tree(self, state: Any, tokens: Array, parents: Array) -> tuple[Array, Any]:
    """Scores a token tree per row in one pass.

    Args:
      state: the generation's state; the caller keeps `cached_lengths(state) + k
        <= cache_len`.
      tokens: int32 `[batch, k]`: node 0 (the root, the last token) and the
        candidates.
      parents: int32 `[k]` or `[batch, k]`, -1 then each node's parent (< its
        index: `trees.check_parents`); a node whose parent is -1 attends to the
        cache only, so a chunk may be a forest under a root cached already (a
        draft's branches: `trees.check_forest`).

    Returns:
      float32 logits `[batch, k, vocab]` (logits[:, i] predict the token after
      the path to node i: node i sits at position `cached_lengths(state) +
      depth(i)` and attends to the cache and its ancestors only) and the state
      with the k nodes cached in index order, every row's length advanced by k.

    Raises:
      ValueError: NumPy `parents` that are not in topological order
        (`trees.check_forest`).
    """
    raise NotImplementedError(f"{type(self).__name__} does not score trees; "
                              "models.llama.LlamaScorer and the T5 scorers "
                              "(models.t5.T5Scorer, SharedEncoderScorer) do.")

  def score_tree_with_features(self, state: Any, tokens: Array, parents: Array
                               ) -> tuple[Array, Array, Any]:
    """`score_tree`, and float32 features `[batch, k, F]` at each node."""
    raise NotImplementedError(f"{type(self).__name__} does not score trees with features "
                              f"(feature_size {self.feature_size}): a draft that reads the "
                              "target's features needs a target that gives them, e.g. "
                              "models.llama.LlamaScorer.")

  def keep_path(self, state: Any, order: Array, lengths: Array) -> Any:
    """After `score_tree`: moves the accepted path's keys and values into place.

    Args:
      state: the state `score_tree` returned.
      order: int32 `[batch, k]`, the accepted path's nodes by depth, root first
        (`trees.path_order`); chunk entry j takes node order[j]'s entries.
      lengths: int32 `[batch]`, each row's cached length afterwards (at most
        the chunk's start + the path's length).
    """
    raise NotImplementedError(f"{type(self).__name__} does not score trees; "
                              "models.llama.LlamaScorer and the T5 scorers "
                              "(models.t5.T5Scorer, SharedEncoderScorer) do.")
