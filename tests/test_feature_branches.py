"""A draft that reads its target's features, expanding the tree loop's tree (`FeatureBranches`).

Greedy tokens equal the target's over several shapes (the chain k = 1 and top-k
branches), with an EOS that ends rows at different lengths; the chain-shaped tree
accepts exactly what the chain loop accepts with the same draft; batch rows are
independent; a commit along a path through the second branch leaves the draft's
state equal to a fresh one built from the accepted text (the target's features
gathered in path order, not node order); and a lower branch's nodes read their own
branch only.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_tree_speculative as tts
from flax import struct
from test_feature_draft import _feature_student
from test_llama import PROMPTS, _random_model

from specdec_jax.decoding import baseline, speculative, tree_speculative, trees
from specdec_jax.decoding import tree_acceptance as ta
from specdec_jax.decoding.proposers import Datastore, Merged, Proposer, tree_parents
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.tree_speculative import tree_speculative_decode
from specdec_jax.models.llama import LlamaScorer, pad_prompts
from specdec_jax.models.llama.feature_branches import FeatureBranches

MAX_LEN = 12
EOS = 96


@functools.cache
def _setup():
  """The tiny target, its greedy decoding of PROMPTS, and a feature draft scoring half the
  tokens that decoding visits (so it agrees often, not always)."""
  model, params = _random_model()
  target = LlamaScorer(model, model.prepare(params))
  prompts = jnp.asarray(pad_prompts(PROMPTS))
  want = baseline.decode(target, prompts, jax.random.PRNGKey(0), max_decode_len=MAX_LEN,
                         warp=Warp(), eos_id=EOS)
  head = jnp.asarray(np.unique(np.asarray(want.sequences)), jnp.int32)
  student, sparams = _feature_student(model.config, head, scale=3.0)
  draft = student.draft(sparams, params["token_embedder"]["embedding"], head)
  return target, draft, prompts, want


def _decode(k: int, depth: int, prompts=None):
  target, draft, all_prompts, _ = _setup()
  return tree_speculative_decode(target, FeatureBranches(draft, k=k, depth=depth),
                                 all_prompts if prompts is None else prompts,
                                 jax.random.PRNGKey(1), max_decode_len=MAX_LEN, warp=Warp(),
                                 eos_id=EOS)


@pytest.mark.parametrize("k,depth", [(1, 1), (1, 3), (2, 1), (2, 2), (3, 4)])
def test_greedy_tokens_are_the_targets(k, depth):
  *_, want = _setup()
  out = _decode(k, depth)
  np.testing.assert_array_equal(out.sequences, want.sequences)
  np.testing.assert_array_equal(out.lengths, want.lengths)
  assert np.sum(out.stats.accepted) > 0  # The draft's candidates make the output.
  if k == 3:  # Lower-ranked branches are accepted too.
    assert np.sum(np.asarray(out.stats.rank_accepted)[..., 1:]) > 0


def test_the_chain_shaped_tree_accepts_what_the_chain_loop_accepts():
  target, draft, prompts, _ = _setup()
  chain = speculative.speculative_decode(target, draft, prompts, jax.random.PRNGKey(1),
                                         gamma=3, max_decode_len=MAX_LEN, warp=Warp(),
                                         eos_id=EOS, draft_inputs=prompts)
  tree = _decode(1, 3)
  np.testing.assert_array_equal(tree.stats.iterations, chain.stats.iterations)
  np.testing.assert_array_equal(tree.stats.accepted_histogram, chain.stats.accepted_histogram)


@struct.dataclass
class _Seen(Proposer):
  """A proposer whose every tree the loop proposes is kept in `SEEN`, by (row, length)."""

  inner: Proposer

  @property
  def parents(self) -> tuple[int, ...]:
    return self.inner.parents

  @property
  def reads_target_features(self) -> bool:
    return self.inner.reads_target_features

  def init_state(self, inputs, cache_len, target_encoded=None):
    return self.inner.init_state(inputs, cache_len, target_encoded)

  def propose(self, state, tokens, lengths, warp, rng=None):
    state, proposal = self.inner.propose(state, tokens, lengths, warp, rng)
    jax.debug.callback(lambda m, x: SEEN.update(
        ((b, int(m[b])), x[b].tolist()) for b in range(len(m))), lengths, proposal.tokens)
    return state, proposal

  def commit(self, state, lengths, tokens, features=None):
    return self.inner.commit(state, lengths, tokens, features)


SEEN: dict[tuple[int, int], list[int]] = {}


def test_the_loop_proposes_what_a_fresh_start_proposes():
  """A merged tree: a datastore's chain of 4 (holding row 1's output, so that its paths
  run deeper than the branches) beside the draft's top-3 branches of depth 2. At every
  length a row reaches, the loop's tree equals the tree proposed from fresh states (the
  target's and the draft's, built from the prompt and the text so far), and the same
  candidates are accepted: the draft's state in the loop read the target's features
  along every accepted path, whichever subtree it ran through."""
  target, draft, prompts, want = _setup()
  store = Datastore.from_sequences([np.asarray(want.sequences[1])], split="train", depth=4)
  proposer = Merged((store, FeatureBranches(draft, k=3, depth=2)))
  parents = tree_parents(proposer)
  width = max(map(len, PROMPTS)) + MAX_LEN

  @jax.jit
  def step(grown, text, m):  # -> the tree, accepted candidates, the path, the next token
    target_state, features = target.init_state_with_features(target.encode(grown), 16)
    state = proposer.init_state(grown, 16, features)
    _, proposal = proposer.propose(state, text, m, Warp())  # The branches read the state.
    tokens = jnp.concatenate([jnp.zeros_like(m)[:, None], proposal.tokens], axis=1)
    logits, _ = target.score_tree(target_state, tokens, parents)
    verdict = ta.verify_tree_greedy(tokens, parents, logits)
    path = jnp.take_along_axis(tokens, verdict.order, axis=1)[:, 1:5]
    return (proposal.tokens, verdict.num_accepted,
            jnp.concatenate([path, verdict.next_token[:, None]], axis=1))

  texts = [[] for _ in PROMPTS]
  fresh = {}
  histogram = np.zeros((len(PROMPTS), 5), np.int32)
  while not all(len(t) >= MAX_LEN or EOS in t for t in texts):
    grown = [p + t for p, t in zip(PROMPTS, texts, strict=True)]
    text = np.zeros((len(PROMPTS), MAX_LEN + 1), np.int32)
    for b, t in enumerate(texts):
      text[b, 1:len(t) + 1] = t
    tree, n, new = step(jnp.asarray(pad_prompts(grown, width)), jnp.asarray(text),
                        jnp.asarray([len(t) for t in texts], jnp.int32))
    for b, t in enumerate(texts):
      if len(t) >= MAX_LEN or EOS in t:
        continue
      fresh[b, len(t)] = np.asarray(tree[b]).tolist()
      emitted = [int(x) for x in new[b, :int(n[b])]] + [int(new[b, -1])]
      emitted = emitted[:emitted.index(EOS) + 1] if EOS in emitted else emitted
      emitted = emitted[:MAX_LEN - len(t)]
      histogram[b, min(int(n[b]), len(emitted))] += 1
      t += emitted
  for b, t in enumerate(texts):
    np.testing.assert_array_equal(t, np.asarray(want.sequences[b, :len(t)]))
  SEEN.clear()
  out = tree_speculative_decode(target, _Seen(proposer), prompts, jax.random.PRNGKey(1),
                                max_decode_len=MAX_LEN, warp=Warp(), eos_id=EOS)
  assert {key: SEEN.get(key) for key in fresh} == fresh
  assert np.sum(histogram[:, 3:]) > 0 and np.sum(out.stats.rank_accepted[:, 0, 1:]) > 0
  np.testing.assert_array_equal(out.stats.accepted_histogram, histogram)


def test_batch_rows_are_independent():
  """Two rows of different prompt lengths, together and each alone."""
  together = _decode(2, 3, jnp.asarray(pad_prompts(PROMPTS[:2])))
  for row, prompt in enumerate(PROMPTS[:2]):
    alone = _decode(2, 3, jnp.asarray(pad_prompts([prompt])))
    np.testing.assert_array_equal(alone.sequences[0], together.sequences[row])
    np.testing.assert_array_equal(alone.stats.accepted_histogram[0],
                                  together.stats.accepted_histogram[row])
    np.testing.assert_array_equal(alone.stats.rank_accepted[0], together.stats.rank_accepted[row])


def test_commit_along_a_path_equals_a_fresh_state_of_the_accepted_text():
  """k = 2, depth 3: row 0 accepts the second branch to depth 2, row 1 nothing, row 2
  the second branch to its leaf; each row's next token is any token (here 7)."""
  target, draft, prompts, _ = _setup()
  proposer = FeatureBranches(draft, k=2, depth=3)
  parents = tree_parents(proposer)                            # [-1, 0, 0, 1, 2, 3, 4]
  cache_len = MAX_LEN + parents.shape[0] + 1
  batch = prompts.shape[0]
  tokens = jnp.zeros((batch, cache_len), jnp.int32)
  node = jnp.asarray([4, 0, 6], jnp.int32)
  order, depth = trees.path_order(parents, node)
  lengths = depth + 1

  @jax.jit
  def propose_and_commit(prompts):
    target_state, prompt_features = target.init_state_with_features(target.encode(prompts),
                                                                     cache_len)
    state = proposer.init_state(prompts, cache_len, prompt_features)
    state, proposal = proposer.propose(state, tokens, jnp.zeros((batch,), jnp.int32), Warp())
    # The second branch's depth-2 node reads the second child and the root's predicted
    # feature only (not the first branch's nodes).
    alone, _, _ = draft.run(state.cache, proposal.tokens[:, 1:2], state.feature[:, None])
    root = jnp.full((batch, 1), target.start_token, jnp.int32)
    tree_tokens = jnp.concatenate([root, proposal.tokens], axis=1)  # [batch, 7]
    _, features, _ = target.score_tree_with_features(target_state, tree_tokens, parents)
    accepted = jnp.take_along_axis(tree_tokens, order, axis=1)[:, 1:]   # [batch, 6]
    text = jnp.where(jnp.arange(6)[None] < depth[:, None], accepted, 7)
    committed = proposer.commit(state, lengths, tokens.at[:, 1:7].set(text),
                                jnp.take_along_axis(features, order[..., None], axis=1))
    return proposal.tokens[:, 3], jnp.argmax(alone[:, 0], axis=-1), text, committed

  @jax.jit
  def fresh_state(grown):
    _, grown_features = target.init_state_with_features(target.encode(grown), cache_len)
    return draft.init_state(grown, cache_len, grown_features)

  proposed, alone, text, committed = propose_and_commit(prompts)
  np.testing.assert_array_equal(proposed, alone)
  fresh = fresh_state(jnp.asarray(pad_prompts([
      prompt + np.asarray(text[b, :int(lengths[b])]).tolist()
      for b, prompt in enumerate(PROMPTS)])))
  np.testing.assert_array_equal(committed.cache.lengths, fresh.cache.lengths)
  np.testing.assert_allclose(committed.logits, fresh.logits, atol=1e-4, rtol=0)
  np.testing.assert_allclose(committed.feature, fresh.feature, atol=1e-4, rtol=0)
  with pytest.raises(ValueError, match="features along the accepted path"):
    proposer.commit(committed, lengths, tokens)


@pytest.mark.parametrize("sample", [False, True])
def test_sampled_tokens_are_distributed_as_the_targets(monkeypatch, sample):
  """Top-k 4 and top-p 0.9 at T = 1 (`test_tree_speculative`'s chi-square over the first
  three tokens of 3,000 rows), the draft's 3 branches of depth 2 (its top-3 and argmax,
  or drawn from it) over a shortlist of the tokens the target may emit first, so that
  candidates are accepted and rejected often. The control forgets each rejected
  candidate and must fail the same test."""
  model, weights, target, prompts = tts._model()
  prompt = prompts[:1]
  first_two = sorted({x for cell in tts._three_token_probs(target, prompt) for x in cell[:2]})
  student, sparams = _feature_student(model.config, jnp.asarray(first_two, jnp.int32), seed=4)
  draft = student.draft(sparams, weights.embedding, jnp.asarray(first_two, jnp.int32))
  proposer = FeatureBranches(draft, k=3, depth=2, sample=sample)
  p_value, counters = tts._chi_square_p_value(target, prompt, proposer)
  assert np.mean(counters.accepted) > 0.3
  assert p_value > 1e-3
  with monkeypatch.context() as patch:
    patch.setattr(ta, "acceptance", type("Forgetful", (), {
        "residual_distribution": staticmethod(lambda r, q: r)}))
    tree_speculative._tree_loop.clear_cache()
    control, _ = tts._chi_square_p_value(target, prompt, proposer)
  tree_speculative._tree_loop.clear_cache()
  assert control < 1e-6
