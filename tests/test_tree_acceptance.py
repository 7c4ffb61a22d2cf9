"""Exactness of acceptance over a token tree (`tree_acceptance`).

(a) exact enumeration on a 4-token vocabulary: over every draw of the drawn
    candidates and every accept/reject outcome, the first depth + 1 emitted
    tokens are distributed exactly as the target's, for trees of mixed origin
    (i.i.d. draft samples, samples without replacement, the draft's top-k,
    deterministic tokens, duplicates), at several temperatures with top-k and
    top-p; the wrong rules (no residual update, an unnormalised residual,
    deterministic candidates accepted outright, a sibling tried without
    removing the ones before it) are detected by the same enumeration;
(b) the jitted walk is the enumerated rule, outcome for outcome, on given uniforms;
(c) Monte Carlo of `verify_tree` under jit, chi-square against the target, with a
    negative control that the same statistic rejects;
(d) temperature 0: the longest argmax path, equal to `verify_tree` on one-hot p
    and to the chain's `verify_greedy`.
"""

import collections
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from specdec_jax.decoding import acceptance, trees
from specdec_jax.decoding import tree_acceptance as ta
from specdec_jax.decoding.sampling import Warp

V = 4


class Model:
  """A distribution over V tokens for every prefix (deterministic random logits, warped)."""

  def __init__(self, seed: int, warp: Warp, depth: int):
    rng = np.random.default_rng(seed)
    self.prefixes = [p for d in range(depth + 1) for p in itertools.product(range(V), repeat=d)]
    logits = rng.normal(size=(len(self.prefixes), V)) * 1.5
    probs = np.asarray(warp.probs(jnp.asarray(logits, jnp.float32)), np.float64)
    self.table = {p: row / row.sum() for p, row in zip(self.prefixes, probs, strict=True)}

  def __call__(self, prefix: tuple[int, ...]) -> np.ndarray:
    return self.table[tuple(prefix)]


def _children(parents):
  kids = collections.defaultdict(list)
  for i, parent in enumerate(parents[1:], start=1):
    kids[parent].append(i)
  return kids


def _residual(r, q, rule):
  res = np.maximum(r - q, 0.0)
  if rule == "unnormalised":
    return res
  mass = res.sum()
  return res / mass if mass > 0 else r


def _proposals(parents, origins, draft):
  """Every assignment of tokens to the candidates: (probability, tokens, q_i, valid) tuples.

  origins: 'iid' (drawn from the draft at the parent), 'wor' (drawn without
  replacement among the earlier 'wor' siblings), ('top', rank) (the draft's
  rank-th token), ('det', token).
  """
  n = len(parents)
  out = []

  def assign(i, prob, tokens, qs, valid):
    if i == n:
      out.append((prob, tuple(tokens), tuple(qs), tuple(valid)))
      return
    parent, origin = parents[i], origins[i]
    path = _path(parents, tokens, parent)
    q = draft(path)
    if origin in ("iid", "wor"):
      if origin == "wor":
        earlier = [tokens[j] for j in range(1, i) if parents[j] == parent and origins[j] == "wor"
                   and valid[j]]
        q = q.copy()
        q[earlier] = 0.0
        if q.sum() == 0:  # Nothing left to draw: the node is absent.
          assign(i + 1, prob, tokens + [0], qs + [np.eye(V)[0]], valid + [False])
          return
        q = q / q.sum()
      for y in range(V):
        if q[y] > 0:
          assign(i + 1, prob * q[y], tokens + [y], qs + [q], valid + [valid[parent]])
      return
    token = origin[1] if origin[0] == "det" else int(np.argsort(-q, kind="stable")[origin[1]])
    assign(i + 1, prob, tokens + [token], qs + [np.eye(V)[token]], valid + [valid[parent]])

  assign(1, 1.0, [0], [np.eye(V)[0]], [True])
  return out


def _path(parents, tokens, node):
  path = []
  while node > 0:
    path.append(tokens[node])
    node = parents[node]
  return tuple(reversed(path))


def _emissions(parents, tokens, qs, valid, target, rule="exact"):
  """{emitted tokens: probability} of the walk, every accept/reject outcome enumerated."""
  kids = _children(parents)
  out = collections.defaultdict(float)

  def visit(node, r, untried, prefix, prob):
    untried = [i for i in untried if valid[i]]
    if not untried:
      for y in range(V):
        if r[y] > 0:
          out[prefix + (y,)] += prob * r[y] / r.sum()
      return
    i, rest = untried[0], untried[1:]
    x, q = tokens[i], qs[i]
    deterministic = q[x] == 1.0
    a = 1.0 if rule == "det_always" and deterministic else min(1.0, r[x] / q[x])
    if a > 0:
      visit(i, target(_path(parents, tokens, i)), kids[i], prefix + (x,), prob * a)
    if a < 1:
      visit(node, r if rule == "no_residual" else _residual(r, q, rule), rest, prefix,
            prob * (1 - a))

  visit(0, target(()), kids[0], (), 1.0)
  return out


def _first_tokens(parents, origins, target, draft, rule="exact", wor_as_iid=False):
  """Exact distribution of the first depth + 1 tokens the walk emits (continued by the target)."""
  depth = int(trees.layout(np.asarray(parents), 1).depths.max())
  k = depth + 1
  dist = np.zeros((V,) * k)
  for prob, tokens, qs, valid in _proposals(parents, origins, draft):
    if wor_as_iid:  # The rule is told q where the sibling was drawn without replacement.
      qs = tuple(draft(_path(parents, tokens, parents[i])) if origins[i] == "wor" else q
                 for i, q in enumerate(qs))
    for seq, pr in _emissions(parents, tokens, qs, valid, target, rule).items():
      for tail in itertools.product(range(V), repeat=k - len(seq)):
        full, weight = seq, prob * pr
        for y in tail:
          weight *= target(full)[y]
          full = full + (y,)
        dist[full] += weight
  return dist


def _target_tokens(target, k):
  dist = np.zeros((V,) * k)
  for seq in itertools.product(range(V), repeat=k):
    dist[seq] = np.prod([target(seq[:j])[seq[j]] for j in range(k)])
  return dist


# (parents, origins); origins[0] is the root's (unused).
TREES = {
    "chain_iid": ([-1, 0, 1, 2], [None, "iid", "iid", "iid"]),
    "iid_siblings_and_lookup": ([-1, 0, 0, 0, 1, 1], [None, ("det", 1), "iid", "iid",
                                                       ("det", 2), "iid"]),
    "without_replacement": ([-1, 0, 0, 1, 1, 2], [None, "wor", "wor", "wor", "wor",
                                                  ("det", 0)]),
    "top_k_and_duplicates": ([-1, 0, 0, 0, 0, 1], [None, ("top", 0), ("det", 0), ("det", 0),
                                                   ("top", 1), "iid"]),
    "everything": ([-1, 0, 0, 0, 1, 2, 2], [None, "wor", "wor", ("det", 2), ("top", 0), "iid",
                                            ("det", 1)]),
}
WARPS = {
    "t1": Warp(1.0),
    "t0.7_topk3": Warp(0.7, top_k=3),
    "t1.3_topp0.8": Warp(1.3, top_p=0.8),
    "t1_topk3_topp0.9": Warp(1.0, top_k=3, top_p=0.9),
    "t0": Warp(0.0),
}


@pytest.mark.parametrize("warp_name", list(WARPS))
@pytest.mark.parametrize("tree_name", list(TREES))
def test_enumeration_emits_the_target_exactly(tree_name, warp_name):
  parents, origins = TREES[tree_name]
  warp = WARPS[warp_name]
  depth = int(trees.layout(np.asarray(parents), 1).depths.max())
  target, draft = Model(1, warp, depth + 1), Model(2, warp, depth + 1)
  got = _first_tokens(parents, origins, target, draft)
  np.testing.assert_allclose(got, _target_tokens(target, depth + 1), atol=1e-12)


# Which wrong rules each tree can expose (a rule that changes nothing on a tree is not a control).
CONTROLS = {
    "chain_iid": [],
    "iid_siblings_and_lookup": ["no_residual", "unnormalised", "det_always"],
    "without_replacement": ["no_residual", "unnormalised", "wor_as_iid", "det_always"],
    "top_k_and_duplicates": ["no_residual", "unnormalised", "det_always"],
    "everything": ["no_residual", "unnormalised", "wor_as_iid", "det_always"],
}


@pytest.mark.parametrize("warp_name", [w for w in WARPS if w != "t0"])
@pytest.mark.parametrize("tree_name", [t for t in TREES if CONTROLS[t]])
def test_enumeration_detects_wrong_rules(tree_name, warp_name):
  parents, origins = TREES[tree_name]
  warp = WARPS[warp_name]
  depth = int(trees.layout(np.asarray(parents), 1).depths.max())
  target, draft = Model(1, warp, depth + 1), Model(2, warp, depth + 1)
  expected = _target_tokens(target, depth + 1)
  for control in CONTROLS[tree_name]:
    if control == "wor_as_iid":
      got = _first_tokens(parents, origins, target, draft, wor_as_iid=True)
    else:
      got = _first_tokens(parents, origins, target, draft, rule=control)
    assert np.abs(got - expected).max() > 1e-3, control


def _reference_walk(uniforms, tokens, parents, p, q, valid):
  """The rule of the module docstring, node by node, with given uniforms."""
  kids = _children(parents)
  node, r, untried = 0, p[0], kids[0]
  while True:
    untried = [i for i in untried if valid[i]]
    if not untried:
      return node, r
    i, untried = untried[0], untried[1:]
    if uniforms[i] * q[i][tokens[i]] < r[tokens[i]]:
      node, r, untried = i, p[i], kids[i]
    else:
      r = _residual(r, q[i], "exact")


def test_walk_is_the_rule_outcome_for_outcome():
  rng = np.random.default_rng(0)
  batch, vocab = 64, 4
  walk = jax.jit(ta.walk)
  for parents, _ in TREES.values():
    k = len(parents)
    tokens = rng.integers(0, vocab, (batch, k))
    p = rng.dirichlet(np.full(vocab, 0.5), (batch, k)).astype(np.float32)
    q = rng.dirichlet(np.full(vocab, 0.5), (batch, k)).astype(np.float32)
    point = rng.random((batch, k)) < 0.3  # Some deterministic candidates.
    q = np.where(point[..., None], np.eye(vocab)[tokens], q).astype(np.float32)
    q[np.arange(batch)[:, None], np.arange(k), tokens] += 0.05  # Drawn tokens have q > 0.
    q /= q.sum(-1, keepdims=True)
    uniforms = rng.random((batch, k)).astype(np.float32)
    valid = rng.random((batch, k)) < 0.9
    node, r = walk(uniforms, tokens, np.asarray(parents), p, q, valid)
    for b in range(batch):
      want_node, want_r = _reference_walk(uniforms[b], tokens[b], parents, p[b], q[b], valid[b])
      assert int(node[b]) == want_node
      np.testing.assert_allclose(r[b], want_r, atol=1e-6)


# The tree of the Monte Carlo test: two children drawn without replacement, a
# deterministic one, and under the first a drawn and a deterministic one.
MC_PARENTS = np.array([-1, 0, 0, 0, 1, 1])


def _mc_tables(vocab):
  rng = np.random.default_rng(5)
  p0 = rng.dirichlet(np.ones(vocab))
  p1 = rng.dirichlet(np.ones(vocab), vocab)  # [y1, vocab]
  p2 = rng.dirichlet(np.ones(vocab), (vocab, vocab))  # [y1, y2, vocab]
  q0 = np.array([0.6, 0.25, 0.1, 0.05])[:vocab]
  q0 /= q0.sum()
  q1 = rng.dirichlet(np.ones(vocab), vocab)
  return p0, p1, p2, q0, q1


@jax.jit
def _mc_round(key, p0, p1, p2, q0, q1, honest):
  """One batch of trees drawn as MC_PARENTS says, verified; the first two tokens emitted."""
  batch, vocab = 20000, p0.shape[0]
  k1, k2, k4, k_verify, k_tail = jax.random.split(key, 5)
  x1 = jax.random.categorical(k1, jnp.log(jnp.broadcast_to(q0, (batch, vocab))))
  q_second = ta.without_replacement(jnp.broadcast_to(q0, (batch, vocab)),
                                    jax.nn.one_hot(x1, vocab, dtype=bool))
  x2 = jax.random.categorical(k2, jnp.log(q_second))
  x3 = jnp.full((batch,), 2)
  x4 = jax.random.categorical(k4, jnp.log(q1[x1]))
  x5 = jnp.full((batch,), 1)
  tokens = jnp.stack([jnp.zeros_like(x1), x1, x2, x3, x4, x5], 1)
  p = jnp.stack([jnp.broadcast_to(p0, (batch, vocab)), p1[x1], p1[x2], p1[x3], p2[x1, x4],
                 p2[x1, x5]], 1)
  q0_rows = jnp.broadcast_to(q0, (batch, vocab))
  q = jnp.stack([q0_rows, q0_rows, q_second, q0_rows, q1[x1], q1[x1]], 1)
  # The control: the lookup's token (node 3) passed as if drawn from the draft.
  drawn = jnp.array([False, True, True, False, True, False]).at[3].set(~honest)
  drawn = jnp.broadcast_to(drawn, (batch, 6))
  out = ta.verify_tree(k_verify, tokens, MC_PARENTS, p, q, drawn)
  path = jnp.take_along_axis(tokens, out.order, axis=1)  # [batch, 6]
  first = jnp.where(out.num_accepted >= 1, path[:, 1], out.next_token)
  second = jnp.where(out.num_accepted >= 2, path[:, 2],
                     jnp.where(out.num_accepted == 1, out.next_token,
                               jax.random.categorical(k_tail, jnp.log(p1[first]))))
  return first * vocab + second


def _chi_square_p_value(honest: bool, rounds: int = 3) -> float:
  vocab = 4
  tables = [jnp.asarray(t, jnp.float32) for t in _mc_tables(vocab)]
  keys = jax.random.split(jax.random.key(7), rounds)
  cells = np.concatenate([np.asarray(_mc_round(key, *tables, jnp.asarray(honest))) for key in keys])
  observed = np.bincount(cells, minlength=vocab * vocab)
  p0, p1 = _mc_tables(vocab)[:2]
  expected = (p0[:, None] * p1).reshape(-1) * cells.size
  return scipy.stats.chisquare(observed, expected).pvalue


def test_monte_carlo_matches_target():
  assert _chi_square_p_value(honest=True) > 1e-3


def test_monte_carlo_rejects_a_lookup_token_tested_as_a_draft_sample():
  assert _chi_square_p_value(honest=False) < 1e-6


def test_greedy_is_the_longest_argmax_path():
  rng = np.random.default_rng(3)
  batch, vocab = 32, 5
  for name in ("top_k_and_duplicates", "everything"):
    parents = TREES[name][0]
    k = len(parents)
    logits = rng.normal(size=(batch, k, vocab)).astype(np.float32)
    argmax = logits.argmax(-1)
    # Make some candidates the argmax after their parent, so paths get long.
    tokens = rng.integers(0, vocab, (batch, k))
    hit = rng.random((batch, k)) < 0.6
    for i in range(1, k):
      tokens[:, i] = np.where(hit[:, i], argmax[:, parents[i]], tokens[:, i])
    greedy = jax.jit(ta.verify_tree_greedy)(tokens, np.asarray(parents), logits)
    one_hot = Warp(0.0).probs(jnp.asarray(logits))
    sampled = jax.jit(ta.verify_tree)(jax.random.key(1), tokens, np.asarray(parents), one_hot)
    for field in ("node", "num_accepted", "order", "next_token"):
      np.testing.assert_array_equal(getattr(greedy, field), getattr(sampled, field), field)
    order, accepted, next_token = map(np.asarray, (greedy.order, greedy.num_accepted,
                                                   greedy.next_token))
    assert accepted.max() >= 2
    for b in range(batch):  # The accepted path is argmax all the way, the next token too.
      path = order[b, :accepted[b] + 1]
      for parent, child in zip(path, path[1:], strict=False):
        assert tokens[b, child] == argmax[b, parent]
      assert next_token[b] == argmax[b, path[-1]]


def test_chain_greedy_equals_the_chains_rule():
  rng = np.random.default_rng(4)
  batch, gamma, vocab = 16, 4, 5
  logits = rng.normal(size=(batch, gamma + 1, vocab)).astype(np.float32)
  proposals = np.where(rng.random((batch, gamma)) < 0.7, logits[:, :gamma].argmax(-1),
                       rng.integers(0, vocab, (batch, gamma)))
  tokens = np.concatenate([np.zeros((batch, 1), int), proposals], 1)
  tree = jax.jit(ta.verify_tree_greedy)(tokens, trees.chain(gamma), logits)
  chain = acceptance.verify_greedy(jnp.asarray(proposals), jnp.asarray(logits))
  np.testing.assert_array_equal(tree.num_accepted, chain.num_accepted)
  np.testing.assert_array_equal(tree.next_token, chain.next_token)
  np.testing.assert_array_equal(tree.order, np.broadcast_to(np.arange(gamma + 1),
                                                            (batch, gamma + 1)))


@pytest.mark.parametrize("kwargs, match", [
    (dict(parents=np.array([-1, 0, 0])), "parents must have shape"),
    (dict(q_probs=np.ones((2, 4, 3)) / 3), "pass q_probs and drawn together"),
    (dict(tokens=np.zeros((2, 4), np.float32)), "tokens must be an int array"),
])
def test_verify_tree_rejects_bad_shapes(kwargs, match):
  args = dict(tokens=np.zeros((2, 4), np.int32), parents=trees.chain(3),
              p_probs=np.ones((2, 4, 3), np.float32) / 3)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    ta.verify_tree(jax.random.key(0), **args)
