"""Tests of the modified rejection rule: the core of the exactness argument.

(a) exact enumeration: accept-or-resample emits exactly p, for many p, q;
(b) Monte Carlo of `verify` itself over whole generations, with negative
    controls (wrong rules) that the same statistic must reject;
(c) at temperature 0 the rule is argmax equality, exactly;
(d) determinism in the rng.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from specdec_jax.decoding import acceptance, sampling


def _acceptance_probability(p: jax.Array, q: jax.Array) -> jax.Array:
  """min(1, p(y) / q(y)) for every y with q(y) > 0 (0 elsewhere: y is never proposed), the
  probability that `verify`'s rule u * q(y) < p(y), u ~ U[0, 1), accepts y
  (`test_verify_accepts_with_probability_min_one_p_over_q`); `[..., vocab]`."""
  return jnp.where(q > 0, jnp.minimum(1.0, p / jnp.where(q > 0, q, 1.0)), 0.0)


@jax.jit
def _emit_distribution(p: jax.Array, q: jax.Array) -> jax.Array:
  """P(emitted token = x) for one proposal x ~ q, with the library's residual.

  Σ_y q(y) a(y) [x == y] + (1 - Σ_y q(y) a(y)) residual(x), for `[rows, vocab]`
  p and q; returns `[rows, vocab]`.
  """
  accepted = q * _acceptance_probability(p, q)  # [rows, vocab]
  residual = acceptance.residual_distribution(p, q)  # [rows, vocab]
  return accepted + (1 - accepted.sum(-1, keepdims=True)) * residual


def _special_pairs(rng: np.random.Generator, vocab: int) -> list[tuple[np.ndarray, np.ndarray]]:
  """(p, q) pairs with the edge cases: zeros on either side, equality, one-hots."""
  def dirichlet():
    return rng.dirichlet(np.full(vocab, 0.7))
  p, q = dirichlet(), dirichlet()
  q_zero = q.copy()
  q_zero[0] = 0.0  # q = 0 where p > 0.
  p_zero = p.copy()
  p_zero[-1] = 0.0  # p = 0 where q > 0.
  one_hot = np.eye(vocab)
  disjoint_p, disjoint_q = np.zeros(vocab), np.zeros(vocab)
  disjoint_p[: vocab // 2], disjoint_q[vocab // 2:] = 1.0, 1.0
  return [
      (p, q),
      (p, q_zero / q_zero.sum()),
      (p_zero / p_zero.sum(), q),
      (p, p),
      (one_hot[0], one_hot[0]),
      (one_hot[0], one_hot[vocab - 1]),
      (one_hot[vocab - 1], q),
      (p, one_hot[0]),
      (disjoint_p / disjoint_p.sum(), disjoint_q / disjoint_q.sum()),
  ]


@pytest.mark.parametrize("vocab", [2, 3, 4, 5, 6])
def test_enumeration_emits_exactly_p(vocab):
  rng = np.random.default_rng(vocab)
  pairs = [pair for _ in range(20) for pair in _special_pairs(rng, vocab)]
  p = jnp.asarray(np.stack([p for p, _ in pairs]), jnp.float32)  # [rows, vocab]
  q = jnp.asarray(np.stack([q for _, q in pairs]), jnp.float32)  # [rows, vocab]
  np.testing.assert_allclose(_emit_distribution(p, q), p, atol=1e-6)


@pytest.mark.parametrize("settings", [
    dict(temperature=1.0),
    dict(temperature=0.6),
    dict(temperature=1.0, top_k=2),
    dict(temperature=1.5, top_p=0.7),
    dict(temperature=0.9, top_k=3, top_p=0.8),
    dict(temperature=0.0),
])
def test_enumeration_with_warped_distributions(settings):
  rng = np.random.default_rng(7)
  for vocab in range(2, 7):
    logits = jnp.asarray(rng.normal(scale=2.0, size=(50, 2, vocab)), dtype=jnp.float32)
    probs = sampling.probs_from_logits(logits, **settings)  # [50, 2, vocab]
    np.testing.assert_allclose(_emit_distribution(probs[:, 0], probs[:, 1]), probs[:, 0],
                               atol=1e-6)


def test_verify_accepts_with_probability_min_one_p_over_q():
  """`verify` itself: each token q can propose is accepted min(1, p/q) of the time."""
  p = jnp.array([0.5, 0.3, 0.2, 0.0])
  q = jnp.array([0.25, 0.6, 0.0, 0.15])
  proposed, rows = jnp.array([0, 1, 3]), 20_000  # The tokens with q > 0.
  proposals = jnp.repeat(proposed, rows)[:, None]  # [3 * rows, 1]
  q_probs = jnp.broadcast_to(q, (3 * rows, 1, 4))
  p_probs = jnp.broadcast_to(p, (3 * rows, 2, 4))
  out = acceptance.verify(jax.random.PRNGKey(0), proposals, q_probs, p_probs)
  frequency = np.asarray(out.num_accepted).reshape(3, rows).mean(axis=1)
  expected = np.asarray(_acceptance_probability(p, q))[np.asarray(proposed)]
  np.testing.assert_allclose(expected, [1.0, 0.5, 0.0])
  np.testing.assert_allclose(frequency, expected, atol=0.015)  # ~4 standard errors.


def test_residual_distribution_values_and_fallback():
  p = jnp.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
  q = jnp.array([[0.25, 0.6, 0.15], [0.2, 0.3, 0.5]])
  np.testing.assert_allclose(acceptance.residual_distribution(p, q),
                             [[0.25 / 0.3, 0.0, 0.05 / 0.3], [0.2, 0.3, 0.5]], rtol=1e-6)


# --- (b) Monte Carlo of whole generations through `verify` ---------------------

VOCAB = 4
START = 0
LENGTH = 3
BATCH = 200_000
# Markov chains: row = previous token. Row 1 has p = 0 where q > 0, row 2 has
# p == q, row 3 has q = 0 where p > 0.
P_CHAIN = np.array([[0.1, 0.2, 0.3, 0.4],
                    [0.4, 0.4, 0.2, 0.0],
                    [0.25, 0.25, 0.25, 0.25],
                    [0.7, 0.1, 0.1, 0.1]])
Q_CHAIN = np.array([[0.4, 0.3, 0.2, 0.1],
                    [0.1, 0.1, 0.3, 0.5],
                    [0.25, 0.25, 0.25, 0.25],
                    [0.1, 0.6, 0.0, 0.3]])


def _accept_all(rng, proposals, q_probs, p_probs):
  """Wrong rule: accept every proposal (emits the draft's distribution)."""
  del q_probs
  batch, gamma = proposals.shape
  next_token = jax.random.categorical(rng, jnp.log(p_probs[:, gamma]), axis=-1)
  return acceptance.VerifyOutput(
      num_accepted=jnp.full((batch,), gamma, jnp.int32), next_token=next_token,
      beta=jnp.zeros((batch, gamma)))


def _resample_from_p(rng, proposals, q_probs, p_probs):
  """Wrong rule: the right acceptance test, but resampling from p, not the residual."""
  out = acceptance.verify(rng, proposals, q_probs, p_probs)
  p_n = jnp.take_along_axis(p_probs, out.num_accepted[:, None, None], axis=1)[:, 0]
  next_token = jax.random.categorical(jax.random.fold_in(rng, 1), jnp.log(p_n), axis=-1)
  return out.replace(next_token=next_token)


@functools.partial(jax.jit, static_argnames=("verify_fn", "gamma"))
def _generate(rng, verify_fn, gamma):
  """Speculative generation of >= LENGTH tokens per row with Markov-chain models.

  Returns:
    tokens: `[BATCH, LENGTH]` the first LENGTH generated tokens.
    first_accepted: `[BATCH]` num_accepted of the first iteration.
  """
  p_chain = jnp.asarray(P_CHAIN, jnp.float32)
  q_chain = jnp.asarray(Q_CHAIN, jnp.float32)
  buffer = LENGTH * (gamma + 1)  # Each iteration writes gamma + 1 slots, >= 1 valid.

  def draft_step(prev, key):
    q = q_chain[prev]  # [BATCH, VOCAB]
    token = jax.random.categorical(key, jnp.log(q), axis=-1)
    return token, (token, q)

  def iteration(carry, key):
    sequences, lengths, last = carry
    draft_key, verify_key = jax.random.split(key)
    _, (proposals, q_probs) = jax.lax.scan(draft_step, last, jax.random.split(draft_key, gamma))
    proposals = proposals.T  # [BATCH, gamma]
    q_probs = q_probs.transpose(1, 0, 2)  # [BATCH, gamma, VOCAB]
    contexts = jnp.concatenate([last[:, None], proposals], axis=1)  # [BATCH, gamma + 1]
    out = verify_fn(verify_key, proposals, q_probs, p_chain[contexts])
    positions = jnp.arange(gamma + 1)
    padded = jnp.pad(proposals, ((0, 0), (0, 1)))
    emitted = jnp.where(positions < out.num_accepted[:, None], padded,
                        out.next_token[:, None])  # [BATCH, gamma + 1]
    sequences = jax.vmap(lambda s, e, i: jax.lax.dynamic_update_slice(s, e, (i,)))(
        sequences, emitted, lengths)
    return (sequences, lengths + out.num_accepted + 1, out.next_token), out.num_accepted

  init = (jnp.zeros((BATCH, buffer), jnp.int32), jnp.zeros((BATCH,), jnp.int32),
          jnp.full((BATCH,), START, jnp.int32))
  (sequences, lengths, _), accepted = jax.lax.scan(iteration, init,
                                                   jax.random.split(rng, LENGTH))
  del lengths  # >= LENGTH for every row: each iteration emits at least one token.
  return sequences[:, :LENGTH], accepted[0]


def _target_joint() -> np.ndarray:
  """`[VOCAB ** LENGTH]` target probabilities of every LENGTH-token sequence."""
  probs = np.ones(1)
  last = np.full(1, START)
  for _ in range(LENGTH):
    probs = (probs[:, None] * P_CHAIN[last]).reshape(-1)
    last = np.tile(np.arange(VOCAB), probs.size // VOCAB)
  return probs


def _joint_p_value(tokens: np.ndarray) -> float:
  """Chi-square p-value of the sequences against the target's joint distribution."""
  codes = tokens @ (VOCAB ** np.arange(LENGTH - 1, -1, -1))
  counts = np.bincount(codes, minlength=VOCAB**LENGTH)
  expected = _target_joint()
  if np.any(counts[expected == 0] > 0):
    return 0.0  # A sequence the target cannot produce.
  kept = expected > 0
  return scipy.stats.chisquare(counts[kept], BATCH * expected[kept]).pvalue


def _first_accepted_probs(gamma: int) -> np.ndarray:
  """`[gamma + 1]` exact P(n = k) in the first iteration: P(n >= k) = (M^k 1)[START]."""
  overlap = np.minimum(P_CHAIN, Q_CHAIN)
  at_least = [np.linalg.matrix_power(overlap, k).sum(-1)[START] for k in range(gamma + 1)]
  return np.append(-np.diff(at_least), at_least[-1])


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_verify_monte_carlo_matches_target(gamma):
  tokens, first_accepted = _generate(jax.random.key(gamma), acceptance.verify, gamma)
  assert _joint_p_value(np.asarray(tokens)) > 1e-3
  # Efficiency, not only correctness: "always reject and sample p" would pass
  # the joint test, so also check the accepted-length distribution.
  counts = np.bincount(np.asarray(first_accepted), minlength=gamma + 1)
  p_value = scipy.stats.chisquare(counts, BATCH * _first_accepted_probs(gamma)).pvalue
  assert p_value > 1e-3


@pytest.mark.parametrize("wrong_rule", [_accept_all, _resample_from_p])
@pytest.mark.parametrize("gamma", [1, 3])
def test_monte_carlo_rejects_wrong_rules(gamma, wrong_rule):
  tokens, _ = _generate(jax.random.key(gamma), wrong_rule, gamma)
  assert _joint_p_value(np.asarray(tokens)) < 1e-6


# --- (c) temperature 0 --------------------------------------------------------


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_reduces_to_argmax_equality(gamma):
  rng = np.random.default_rng(gamma)
  batch, vocab = 4096, 5
  # Small integer logits: ties are frequent and must go to the lowest id.
  target_logits = rng.integers(0, 3, size=(batch, gamma + 1, vocab)).astype(np.float32)
  draft_logits = target_logits[:, :gamma].copy()
  flip = rng.random((batch, gamma)) < 0.2
  draft_logits[flip] = rng.integers(0, 3, size=(flip.sum(), vocab))
  p = sampling.probs_from_logits(jnp.asarray(target_logits), temperature=0.0)
  q = sampling.probs_from_logits(jnp.asarray(draft_logits), temperature=0.0)
  proposals = sampling.sample(None, jnp.asarray(draft_logits), temperature=0.0)

  target_argmax = target_logits.argmax(-1)  # [batch, gamma + 1], ties -> first.
  match = np.asarray(proposals) == target_argmax[:, :gamma]
  expected_n = np.cumprod(match, axis=1).sum(1)
  assert 0 < expected_n.mean() < gamma  # Both branches occur.
  verify = jax.jit(acceptance.verify)
  for seed in range(3):
    out = verify(jax.random.key(seed), proposals, q, p)
    np.testing.assert_array_equal(out.num_accepted, expected_n)
    np.testing.assert_array_equal(out.next_token, target_argmax[np.arange(batch), expected_n])
    np.testing.assert_array_equal(out.beta, match.astype(np.float32))
  greedy = acceptance.verify_greedy(proposals, jnp.asarray(target_logits))
  for field in ("num_accepted", "next_token", "beta"):
    np.testing.assert_array_equal(getattr(greedy, field), getattr(out, field))


# --- (d) determinism and the outputs' form --------------------------------------


def _random_chunk(batch: int, gamma: int, vocab: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  q = rng.dirichlet(np.ones(vocab), size=(batch, gamma)).astype(np.float32)
  p = rng.dirichlet(np.ones(vocab), size=(batch, gamma + 1)).astype(np.float32)
  proposals = (q.cumsum(-1) < rng.random((batch, gamma, 1))).sum(-1).clip(0, vocab - 1)
  return jnp.asarray(proposals, jnp.int32), jnp.asarray(q), jnp.asarray(p)


def test_same_rng_same_output_different_rng_differs():
  proposals, q, p = _random_chunk(10_000, 3, 6)
  verify = jax.jit(acceptance.verify)
  first = verify(jax.random.key(0), proposals, q, p)
  again = verify(jax.random.key(0), proposals, q, p)
  other = verify(jax.random.key(1), proposals, q, p)
  for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(again), strict=True):
    np.testing.assert_array_equal(a, b)
  assert np.any(first.num_accepted != other.num_accepted)
  assert np.any(first.next_token != other.next_token)
  np.testing.assert_array_equal(first.beta, other.beta)


def test_output_shapes_and_consistency():
  batch, gamma, vocab = 512, 4, 7
  proposals, q, p = _random_chunk(batch, gamma, vocab, seed=3)
  out = jax.jit(acceptance.verify)(jax.random.key(5), proposals, q, p)
  assert out.num_accepted.shape == (batch,) and out.num_accepted.dtype == jnp.int32
  assert out.next_token.shape == (batch,) and out.next_token.dtype == jnp.int32
  assert out.beta.shape == (batch, gamma) and out.beta.dtype == jnp.float32
  assert np.all((out.num_accepted >= 0) & (out.num_accepted <= gamma))
  np.testing.assert_allclose(out.beta, np.minimum(p[:, :gamma], q).sum(-1), rtol=1e-6)
  assert np.all((out.next_token >= 0) & (out.next_token < vocab))


@pytest.mark.parametrize("shapes,match", [
    (((2, 3), (2, 3, 5), (2, 3, 5)), "p_probs"),
    (((2, 3), (2, 2, 5), (2, 4, 5)), "q_probs"),
    (((2,), (2, 1, 5), (2, 2, 5)), "proposals"),
    (((2, 0), (2, 0, 5), (2, 1, 5)), "gamma >= 1"),
])
def test_verify_rejects_bad_shapes(shapes, match):
  proposal_shape, q_shape, p_shape = shapes
  with pytest.raises(ValueError, match=match):
    acceptance.verify(jax.random.key(0), jnp.zeros(proposal_shape, jnp.int32),
                      jnp.full(q_shape, 0.2), jnp.full(p_shape, 0.2))
