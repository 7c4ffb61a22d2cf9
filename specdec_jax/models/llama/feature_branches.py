"""A draft that reads its target's features, expanding a token tree (EAGLE's tree).

`FeatureBranches` is the tree loop's proposer (`decoding.proposers.Proposer`) over a
`FeatureDraft`: the draft's top-k tokens after the root, each extended by its argmax
to `depth` tokens (`decoding.trees.branches`), as `proposers.DraftBranches` does for
a draft of tokens alone. Where the features come from, in the tree loop's iteration
at length m (`decoding.tree_speculative`):

  init_state  the draft's `init_state`: the prompt, reading the target's prefill
              features; q and the predicted feature at the root (position m = 0).
  propose     the root's k children are the top-k of the kept q (computed from
              the target's true features), or at T > 0 k draws from it without
              replacement (`sample`). Each deeper level is one draft call
              over the partial tree after the root, every node reading its
              parent's feature as the draft predicted it (the root's children
              read the one predicted at the root), attending to its own branch
              only; the argmax under each branch's newest node (at T > 0 a draw
              from its q) extends it. The draft's cache is left at m (what the
              calls wrote is overwritten).
  commit      the target scored the tree and gives its features along the
              accepted path (positions m .. m + D, D the whole tree's depth: a
              merged tree's path may run through a deeper proposer's subtree); the
              draft runs positions m + 1 .. m + D + 1 of the accepted text reading them
              (`FeatureDraft.advance`), so its state equals the chain loop's after
              the same text: every cached position read the target's true feature.

k = 1 is the chain: the same proposals, state and accepted tokens as `FeatureDraft`
at gamma = depth in the chain loop, through this one code path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax.decoding import trees
from specdec_jax.decoding.proposers import (
  Proposer,
  TreeProposal,
  branch_level,
  branch_parents,
  concat_proposals,
  level_keys,
)
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models.llama.feature_draft import FeatureDraft, FeatureDraftState

Array = jax.Array


@struct.dataclass
class FeatureBranches(Proposer):
  """A `FeatureDraft`'s top-`k` tokens after the root, each extended by its argmax to `depth`.

  At T > 0 with `sample`, the root's children are drawn from the draft's q without
  replacement and each deeper node from q at its parent (`proposers.branch_level`).

  Attributes:
    draft: the `FeatureDraft`.
    k: branches (static).
    depth: tokens per branch (static).
    sample: draw the candidates at T > 0 instead of the top-k and argmax (static).
  """

  draft: FeatureDraft
  k: int = struct.field(pytree_node=False)
  depth: int = struct.field(pytree_node=False)
  sample: bool = struct.field(pytree_node=False, default=True)

  @property
  def parents(self) -> tuple[int, ...]:
    return branch_parents(self.k, self.depth)

  @property
  def forward_passes(self) -> int:
    return self.depth  # depth - 1 levels in `propose`, the accepted text in `commit`.

  @property
  def reads_target_features(self) -> bool:
    return True

  def init_state(self, inputs: Array, cache_len: int,
                 target_encoded: Array | None = None) -> FeatureDraftState:
    """The draft's state after the prompts `inputs [batch, width]`, reading the target's
    prefill features `target_encoded [batch, width - 1, F]` (`FeatureDraft.init_state`)."""
    return self.draft.init_state(inputs, cache_len, target_encoded)

  def propose(self, state: FeatureDraftState, tokens: Array, lengths: Array, warp: Warp,
              rng: Array | None = None) -> tuple[FeatureDraftState, TreeProposal]:
    del tokens, lengths  # The state is at the loop's length (commit keeps it there).
    batch = state.logits.shape[0]
    keys = level_keys(rng, self.depth)
    levels = [branch_level(keys[0], state.logits, self.k, warp, sample=self.sample)]
    features = jnp.broadcast_to(state.feature[:, None], (batch, self.k, self.draft.feature_size))
    parents = np.asarray(self.parents)
    start = state.cache.lengths
    for d in range(1, self.depth):  # One level per call.
      nodes = jnp.concatenate([level.tokens for level in levels], axis=1)
      size = nodes.shape[1]
      tree = trees.layout(parents[:size], batch)
      logits, predicted, cache = self.draft.run(state.cache, nodes, features,
                                                (tree.depths, tree.ancestors))
      state = state.replace(cache=cache.rewind(start))
      levels.append(branch_level(keys[d], logits[:, size - self.k:], self.k, warp,
                                 sample=self.sample))
      features = jnp.concatenate([features, predicted[:, size - self.k:]], axis=1)
    return state, concat_proposals(levels)

  def commit(self, state: FeatureDraftState, lengths: Array, tokens: Array,
             features: Array | None = None) -> FeatureDraftState:
    if features is None:
      raise ValueError("FeatureBranches.commit needs the target's features along the "
                       "accepted path; the tree loop passes them.")
    # The path may be deeper than these branches (through a deeper proposer of a merged tree).
    return self.draft.advance(state, lengths, tokens, features)
