"""Proposers: where a token tree's candidates come from, each usable alone, merged in one tree.

A proposer offers a subtree under the root (the last token of the text) of a
fixed shape: `parents` (static) numbers its nodes 0..k-1, -1 meaning a child of
the root, and each call fills its tokens and which of them a row holds
(`TreeProposal`). `Merged` puts several proposers' subtrees side by side under
one root, in the order given (siblings are tried in that order). A
candidate is either deterministic given what the proposer saw (a point mass:
`tree_acceptance` accepts it with the target's probability of it) or drawn
from the draft's warped distribution, which the proposal then carries
(`TreeProposal.q_probs`); `tree_acceptance` is exact for both, so the tree is
exact at every temperature.

  * `PromptLookup`: the continuation of the longest n-gram of the text that
    ends at the last token and appears in the prompt (a chain).
  * `Datastore`: the same over a store of the target's outputs on the
    TRAINING split (REST, SuffixDecoding): a sorted table of n-grams and the
    tokens that followed them (a chain).
  * `DraftBranches`: a model draft's top-k tokens after the root, each
    extended by the draft's argmax (k chains); the draft scores the partial
    tree level by level (`Scorer.score_tree`). A draft that reads the target's
    features does the same in its family's package
    (`models.llama.feature_branches.FeatureBranches`): the loop gives it the
    target's features (`Proposer.reads_target_features`). At T > 0 both draw
    instead (`sample`, the default): the root's k children from the draft's q
    without replacement (Jeon et al.'s recursive rejection sampling; Sequoia),
    each deeper node from q at its parent (SpecInfer); `branch_level` does
    either. At T > 0 a top-k candidate is accepted with the target's
    probability of it, a drawn one with sum_y min(p, q): the draft's alpha.

Conventions shared with `drafts.py`: `tokens [batch, buffer_len]` holds the
start token at index 0 and the generated tokens after it; `lengths [batch]` = m
tokens generated, so `tokens[:, m]` is the last (the root).
"""

from __future__ import annotations

import abc
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax.decoding import lookup, sampling, trees
from specdec_jax.decoding import tree_acceptance as ta
from specdec_jax.decoding.drafts import ScorerDraft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import EncoderOutputs

Array = jax.Array


@struct.dataclass
class TreeProposal:
  """One proposer's candidates under the root.

  Attributes:
    tokens: int32 `[batch, k]`.
    valid: bool `[batch, k]`, False where a row has no candidate (never tried).
    q_probs: None (every candidate deterministic), or float32 `[batch, k, vocab]`: the
      warped distribution each candidate was drawn from, given the siblings drawn
      before it (`tree_acceptance.verify_tree`'s q_probs).
    drawn: None, or bool `[batch, k]` with `q_probs`: True where drawn from it, False
      where deterministic.
  """

  tokens: Array
  valid: Array
  q_probs: Array | None = None
  drawn: Array | None = None


def branch_level(rng: Array | None, logits: Array, count: int, warp: Warp, *, sample: bool
                 ) -> TreeProposal:
  """A level of a draft's branches from the draft's logits.

  Args:
    rng: a PRNG key (used where candidates are drawn).
    logits: `[batch, vocab]` the draft's at the root, or `[batch, k, vocab]` at each
      branch's newest node.
    count: with the root's logits, the k children: the top-k, or k draws without
      replacement from q = `warp.probs(logits)` (each from q with the siblings before
      it removed, renormalised: `tree_acceptance.without_replacement`); with the
      branches' logits, ignored: one child each, the argmax or one draw from q.
    warp: the sampling settings (temperature 0: always the top-k / argmax).
    sample: whether to draw at temperature > 0.

  Returns:
    The level's `TreeProposal` (`[batch, k]`): valid where a draw had mass left;
    `q_probs` and `drawn` where drawn.
  """
  if not (sample and warp.temperature > 0):
    tokens = (jax.lax.top_k(logits, count)[1] if logits.ndim == 2
              else jnp.argmax(logits, axis=-1)).astype(jnp.int32)
    return TreeProposal(tokens, jnp.ones(tokens.shape, bool))
  probs = warp.probs(logits)
  if probs.ndim == 3:  # One child per branch, drawn from q itself.
    tokens = sampling.sample_from_probs(rng, probs)
    return TreeProposal(tokens, jnp.ones(tokens.shape, bool), probs,
                        jnp.ones(tokens.shape, bool))
  earlier = jnp.zeros(probs.shape, bool)
  tokens, rows = [], []
  for key in jax.random.split(rng, count):
    q = ta.without_replacement(probs, earlier)  # [batch, vocab]
    # A row with no mass left draws from a dummy row; the candidate is marked invalid.
    token = sampling.sample_from_probs(key, jnp.where(jnp.any(q > 0, -1, keepdims=True), q, 1.0))
    earlier = earlier | jax.nn.one_hot(token, probs.shape[-1], dtype=bool)
    tokens.append(token)
    rows.append(q)
  tokens, rows = jnp.stack(tokens, 1), jnp.stack(rows, 1)  # [batch, k], [batch, k, vocab]
  valid = jnp.take_along_axis(rows, tokens[..., None], axis=-1)[..., 0] > 0
  return TreeProposal(tokens, valid, rows, jnp.ones(tokens.shape, bool))


def level_keys(rng: Array | None, depth: int) -> list[Array | None]:
  """A key per level of a draft's branches (None where no key was given)."""
  return [None] * depth if rng is None else list(jax.random.split(rng, depth))


def concat_proposals(parts: list[TreeProposal]) -> TreeProposal:
  """Proposals side by side (`[batch, sum of k]`); q_probs where any part carries them
  (zeros and drawn False for the deterministic parts)."""
  tokens = jnp.concatenate([p.tokens for p in parts], axis=1)
  valid = jnp.concatenate([p.valid for p in parts], axis=1)
  carried = [p.q_probs for p in parts if p.q_probs is not None]
  if not carried:
    return TreeProposal(tokens, valid)
  vocab = carried[0].shape[-1]
  q_probs = jnp.concatenate([
      p.q_probs if p.q_probs is not None else jnp.zeros(p.tokens.shape + (vocab,), jnp.float32)
      for p in parts], axis=1)
  drawn = jnp.concatenate([p.drawn if p.drawn is not None else jnp.zeros(p.tokens.shape, bool)
                           for p in parts], axis=1)
  return TreeProposal(tokens, valid, q_probs, drawn)


def longest_match(source: Array, tokens: Array, lengths: Array, *, depth: int,
                  max_ngram: int) -> TreeProposal:
  """The `depth` source tokens after the longest n-gram (n = max_ngram .. 1) that ends
  at the last token, earliest match first (`lookup.match_start`).

  Args:
    source: int32 `[batch, L]`, 0-padded (0 never matches).
    tokens: int32 `[batch, buffer_len]`, the text so far.
    lengths: int32 `[batch]`.
    depth: tokens to copy.
    max_ngram: the longest n-gram tried.

  Returns:
    A chain's `TreeProposal` `[batch, depth]`: valid where a match exists and
    the source has a nonzero token there.
  """
  source_len = source.shape[1]
  found, start = lookup.match_start(source, tokens, lengths, max_ngram)
  positions = start[:, None] + jnp.arange(depth)[None]  # [batch, depth]
  copied = jnp.take_along_axis(source, jnp.minimum(positions, source_len - 1), axis=1)
  valid = found[:, None] & (positions < source_len) & (copied != 0)
  return TreeProposal(copied.astype(jnp.int32), jnp.cumprod(valid, axis=1).astype(bool))


def chain_parents(depth: int) -> tuple[int, ...]:
  """A chain under the root: (-1, 0, 1, ..., depth - 2)."""
  return tuple(range(-1, depth - 1))


def branch_parents(k: int, depth: int) -> tuple[int, ...]:
  """`trees.branches(k, depth)` under the root: its nodes' parents without node 0."""
  return tuple(int(p) - 1 for p in trees.branches(k, depth)[1:])


class Proposer(abc.ABC):
  """What the tree loop needs from a source of candidates."""

  @property
  @abc.abstractmethod
  def parents(self) -> tuple[int, ...]:
    """The subtree's shape: node i's parent, -1 for a child of the root (< i otherwise)."""

  @property
  def forward_passes(self) -> int:
    """Model forward passes per iteration (0 for table look-ups)."""
    return 0

  @property
  def reads_target_encoder(self) -> bool:
    """Whether `init_state` needs the target's encoder outputs."""
    return False

  @property
  def reads_target_features(self) -> bool:
    """Whether it reads the target's features (EAGLE-style): then `init_state` takes the
    prompts' as `target_encoded` (`Scorer.init_state_with_features`) and `commit` the
    accepted path's (`Scorer.score_tree_with_features`)."""
    return False

  @abc.abstractmethod
  def init_state(self, inputs: Array, cache_len: int,
                 target_encoded: EncoderOutputs = None) -> Any:
    """Per-generation state, from the inputs (the prompts of a decoder-only target)."""

  @abc.abstractmethod
  def propose(self, state: Any, tokens: Array, lengths: Array, warp: Warp,
              rng: Array | None = None) -> tuple[Any, TreeProposal]:
    """Fills the subtree after `tokens[:, :lengths + 1]` (module docstring's conventions);
    `rng` is the PRNG key of the candidates a proposer draws (unused by the others)."""

  def commit(self, state: Any, lengths: Array, tokens: Array, features: Array | None = None
             ) -> Any:
    """Takes the accepted text.

    Args:
      state: the state `propose` returned at the loop's length m.
      lengths: int32 `[batch]`, m' = m + 1 + the accepted path's depth (m where a
        row is finished).
      tokens: int32 `[batch, buffer_len]`, the text with tokens m + 1 .. m' written.
      features: float32 `[batch, D + 1, F]` if `reads_target_features` (else None),
        D the whole tree's depth (a merged tree's deepest subtree): the target's
        features along the accepted path, root first (entry d at position m + d;
        entries past the path are arbitrary).
    """
    del lengths, tokens, features
    return state


@struct.dataclass
class PromptLookup(Proposer):
  """A chain of `depth` tokens copied from the prompt (`longest_match`)."""

  depth: int = struct.field(pytree_node=False)
  max_ngram: int = struct.field(pytree_node=False, default=3)

  @property
  def parents(self) -> tuple[int, ...]:
    return chain_parents(self.depth)

  def init_state(self, inputs: Array, cache_len: int,
                 target_encoded: EncoderOutputs = None) -> Array:
    del cache_len, target_encoded
    return inputs

  def propose(self, state: Array, tokens: Array, lengths: Array, warp: Warp,
              rng: Array | None = None) -> tuple[Array, TreeProposal]:
    del warp, rng
    return state, longest_match(state, tokens, lengths, depth=self.depth,
                                max_ngram=self.max_ngram)


def _hash(grams: Array) -> Array:
  """int32 `[...]` of n-grams `[..., n]` (wrapping int32 arithmetic: host and device agree)."""
  h = jnp.zeros(grams.shape[:-1], jnp.int32)
  for i in range(grams.shape[-1]):
    h = h * jnp.int32(1000003) + grams[..., i].astype(jnp.int32)
  return h


@struct.dataclass
class Datastore(Proposer):
  """A chain of `depth` tokens that followed the text's last n-gram in stored outputs.

  Built on the host from the target's outputs on the training split only
  (`from_sequences`). For n = max_ngram .. 1 it holds every distinct n-gram
  of the outputs once (its first occurrence) with the `depth` tokens after it,
  sorted by a hash of the n-gram; a look-up is a binary search, then a check
  that the n-gram is the text's (a hash collision proposes nothing).

  Attributes:
    depth: tokens proposed (static).
    keys: per n, int32 `[N_n]` sorted hashes.
    grams: per n, int32 `[N_n, n]` the n-grams.
    follow: per n, int32 `[N_n, depth]` the tokens after them (0: none).
  """

  depth: int = struct.field(pytree_node=False)
  keys: tuple[Array, ...]
  grams: tuple[Array, ...]
  follow: tuple[Array, ...]

  @classmethod
  def from_sequences(cls, sequences: list[np.ndarray], *, split: str, depth: int,
                     max_ngram: int = 3) -> Datastore:
    """The store of `sequences` (int token arrays, the target's outputs, 0 = padding).

    Raises:
      ValueError: unless `split` is "train": outputs on held-out prompts would
        leak the test set into what is measured on it.
    """
    if split != "train":
      raise ValueError(f"split={split!r}: a datastore holds the target's outputs on the "
                       "training split only; build it from the 'train' split's outputs.")
    keys, grams, follow = [], [], []
    for n in range(max_ngram, 0, -1):
      rows, tails = [], []
      for seq in sequences:
        seq = np.asarray(seq, np.int32)
        seq = seq[:np.argmax(seq == 0)] if np.any(seq == 0) else seq
        padded = np.concatenate([seq, np.zeros(depth, np.int32)])
        for end in range(n, len(seq)):  # At least one token follows.
          rows.append(seq[end - n:end])
          tails.append(padded[end:end + depth])
      gram = np.asarray(rows, np.int32).reshape(-1, n)
      tail = np.asarray(tails, np.int32).reshape(-1, depth)
      key = np.asarray(_hash(jnp.asarray(gram)))
      _, first = np.unique(key, return_index=True)  # Sorted keys, first occurrence each.
      keys.append(jnp.asarray(key[first]))
      grams.append(jnp.asarray(gram[first]))
      follow.append(jnp.asarray(tail[first]))
    return cls(depth, tuple(keys), tuple(grams), tuple(follow))

  @property
  def parents(self) -> tuple[int, ...]:
    return chain_parents(self.depth)

  def init_state(self, inputs: Array, cache_len: int,
                 target_encoded: EncoderOutputs = None) -> None:
    del inputs, cache_len, target_encoded

  def propose(self, state: None, tokens: Array, lengths: Array, warp: Warp,
              rng: Array | None = None) -> tuple[None, TreeProposal]:
    del warp, rng
    batch = tokens.shape[0]
    found = jnp.zeros((batch,), bool)
    out = jnp.zeros((batch, self.depth), jnp.int32)
    for keys, grams, follow in zip(self.keys, self.grams, self.follow, strict=True):
      if keys.shape[0] == 0:
        continue
      gram, inside = lookup.last_grams(tokens, lengths, grams.shape[1])
      at = jnp.minimum(jnp.searchsorted(keys, _hash(gram)), keys.shape[0] - 1)  # [batch]
      hit = jnp.all(grams[at] == gram, axis=1) & inside & ~found
      out = jnp.where(hit[:, None], follow[at], out)
      found = found | hit
    valid = found[:, None] & jnp.cumprod(out != 0, axis=1).astype(bool)
    return state, TreeProposal(out, valid)


@struct.dataclass
class DraftBranches(Proposer):
  """A model draft's top-`k` tokens after the root, each extended by its argmax to `depth`.

  The subtree: k children of the root (the draft's top-k, rank order), then
  per level one child under each branch. Each level is one draft call that
  scores the partial tree after the root (`Scorer.score_tree`): the nodes
  attend to their own branch only. The draft's cache keeps the accepted text:
  `propose` scores the root and leaves it cached, `commit` scores the
  accepted tokens after it (one chain call of `depth` tokens) and rewinds.

  At T > 0 with `sample`, the root's children are drawn from the draft without
  replacement and each deeper node from the draft at its parent (`branch_level`).

  Attributes:
    draft: a `drafts.ScorerDraft` whose scorer scores trees.
    k: branches (static).
    depth: tokens per branch (static).
    sample: draw the candidates at T > 0 instead of the top-k and argmax (static).
  """

  draft: ScorerDraft
  k: int = struct.field(pytree_node=False)
  depth: int = struct.field(pytree_node=False)
  sample: bool = struct.field(pytree_node=False, default=True)

  @property
  def parents(self) -> tuple[int, ...]:
    return branch_parents(self.k, self.depth)

  @property
  def forward_passes(self) -> int:
    return self.depth + 1

  @property
  def reads_target_encoder(self) -> bool:
    return self.draft.reads_target_encoder

  def init_state(self, inputs: Array, cache_len: int,
                 target_encoded: EncoderOutputs = None) -> Any:
    return self.draft.init_state(inputs, cache_len, target_encoded)

  def propose(self, state: Any, tokens: Array, lengths: Array, warp: Warp,
              rng: Array | None = None) -> tuple[Any, TreeProposal]:
    scorer = self.draft.scorer
    keys = level_keys(rng, self.depth)
    last = jnp.take_along_axis(tokens, lengths[:, None], axis=1)  # [batch, 1]
    logits, state = scorer.score(state, last)
    levels = [branch_level(keys[0], logits[:, 0], self.k, warp, sample=self.sample)]
    parents = np.asarray(self.parents)
    for d in range(1, self.depth):  # One level per call.
      nodes = jnp.concatenate([level.tokens for level in levels], axis=1)
      size = nodes.shape[1]
      logits, state = scorer.score_tree(state, nodes, parents[:size])
      state = scorer.rewind(state, lengths + 1)
      levels.append(branch_level(keys[d], logits[:, size - self.k:], self.k, warp,
                                 sample=self.sample))
    return state, concat_proposals(levels)

  def commit(self, state: Any, lengths: Array, tokens: Array, features: Array | None = None
             ) -> Any:
    del features
    scorer = self.draft.scorer
    start = scorer.cached_lengths(state)  # m + 1: the root is cached.
    index = start[:, None] + jnp.arange(self.depth)[None]
    _, state = scorer.score(state, jnp.take_along_axis(tokens, index, axis=1))
    return scorer.rewind(state, lengths)


@struct.dataclass
class Merged(Proposer):
  """Several proposers' subtrees side by side under one root, tried in the order given."""

  proposers: tuple[Proposer, ...]

  @property
  def parents(self) -> tuple[int, ...]:
    out, offset = [], 0
    for proposer in self.proposers:
      out += [p if p < 0 else p + offset for p in proposer.parents]
      offset += len(proposer.parents)
    return tuple(out)

  @property
  def forward_passes(self) -> int:
    return sum(p.forward_passes for p in self.proposers)

  @property
  def reads_target_encoder(self) -> bool:
    return any(p.reads_target_encoder for p in self.proposers)

  @property
  def reads_target_features(self) -> bool:
    return any(p.reads_target_features for p in self.proposers)

  def init_state(self, inputs: Array, cache_len: int,
                 target_encoded: EncoderOutputs = None) -> tuple[Any, ...]:
    return tuple(p.init_state(inputs, cache_len, target_encoded) for p in self.proposers)

  def propose(self, state: tuple[Any, ...], tokens: Array, lengths: Array, warp: Warp,
              rng: Array | None = None) -> tuple[tuple[Any, ...], TreeProposal]:
    states, parts = zip(*(
        p.propose(s, tokens, lengths, warp, None if rng is None else jax.random.fold_in(rng, i))
        for i, (p, s) in enumerate(zip(self.proposers, state, strict=True))), strict=True)
    return states, concat_proposals(list(parts))

  def commit(self, state: tuple[Any, ...], lengths: Array, tokens: Array,
             features: Array | None = None) -> tuple[Any, ...]:
    return tuple(p.commit(s, lengths, tokens, features if p.reads_target_features else None)
                 for p, s in zip(self.proposers, state, strict=True))


def tree_parents(proposer: Proposer) -> np.ndarray:
  """int32 `[n + 1]`: the whole tree's parents, the root first (`trees.check_parents`)."""
  return np.asarray([-1] + [p + 1 for p in proposer.parents], np.int32)
